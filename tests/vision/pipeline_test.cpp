// Specification of vision::ImagePipeline through the loader (in progress).
