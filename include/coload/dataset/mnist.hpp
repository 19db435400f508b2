#pragma once
// MNIST: the handwritten digits, read from the IDX files torchvision's MNIST reads.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <utility>

#include "coload/sampler/sampler.hpp"

namespace coload {

/// The MNIST digits, as torchvision.datasets.MNIST(root, train) without the download.
///
/// Reads `train-images-idx3-ubyte` and `train-labels-idx1-ubyte` (`t10k-*` when `train` is
/// false), or their `.gz` forms, from `root`, or from `root/MNIST/raw` as torchvision lays them
/// out. The whole image file is loaded once, into one uint8 [N, rows, cols] tensor ([N, 28, 28]
/// for MNIST); the labels become one int64 [N] tensor. A sample is the pair (image, label):
/// a uint8 [28, 28] tensor and an int64.
///
/// Throws std::runtime_error naming the file and what was expected for a missing file, a wrong
/// magic number, a truncated (or overlong) file, and image and label files of different counts.
class MNIST {
 public:
  /// Loads the training set (`train`) or the test set from `root`.
  explicit MNIST(const std::filesystem::path& root, bool train = true);

  /// The number of images.
  std::int64_t size() const noexcept { return images_.size(0); }
  /// Image `index` (a uint8 [rows, cols] view) and its label (negative indices count from the
  /// end; c10::IndexError when out of range).
  std::pair<at::Tensor, std::int64_t> get(Index index) const;
  /// Images `indices` (uint8 [B, rows, cols]) and their labels (int64 [B]), gathered with
  /// index_select: the batch default_collate would make of the samples.
  std::pair<at::Tensor, at::Tensor> get_batch(std::span<const Index> indices) const;

  /// All images, uint8 [N, rows, cols] (torchvision's `data`).
  const at::Tensor& images() const noexcept { return images_; }
  /// All labels, int64 [N] (torchvision's `targets`).
  const at::Tensor& targets() const noexcept { return targets_; }
  /// The image file read.
  const std::filesystem::path& images_path() const noexcept { return images_path_; }
  /// The label file read.
  const std::filesystem::path& labels_path() const noexcept { return labels_path_; }

  /// Reads an IDX file of uint8 images (magic 0x00000803): a [N, rows, cols] tensor.
  static at::Tensor read_images(const std::filesystem::path& path);
  /// Reads an IDX file of uint8 labels (magic 0x00000801): an int64 [N] tensor.
  static at::Tensor read_labels(const std::filesystem::path& path);

 private:
  at::Tensor images_;
  at::Tensor targets_;
  const std::int64_t* labels_ = nullptr;
  std::filesystem::path images_path_;
  std::filesystem::path labels_path_;
};

}  // namespace coload
