// examples/readme_images: the README's image-pipeline snippet, whole. The lines between the
// [readme:images] markers are a code block of the README, word for word
// (tests/examples/readme_snippets.py checks it, and runs this program on a small generated
// folder), so the snippet compiles and runs as written.
//
//   readme_images [ROOT]   (default: build/data/image_folder, the folder tools/run generates)
// [readme:images]
#include <coload/coload.hpp>
#include <coload/vision/pipeline.hpp>

#include <iostream>

int main(int argc, char** argv) {
  // torchvision's ImageFolder and ImageNet train transform, decoded straight into each batch
  coload::vision::ImagePipeline images(argc > 1 ? argv[1] : "build/data/image_folder",
                                       coload::vision::TrainTransform{});
  auto loader = coload::make_data_loader(
      images, {.batch_size = 64, .shuffle = true, .num_workers = 2, .seed = 0});
  for (auto& [x, labels] : loader) std::cout << x.sizes() << ' ' << labels.sizes() << '\n';
}
// [/readme:images]
