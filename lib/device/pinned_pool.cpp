// PinnedPool, BatchLease and Pinner's leaf: page-locked slabs, carved per batch and recycled.

#include <ATen/ATen.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <vector>

#include "coload/core/error.hpp"
#include "coload/core/math.hpp"
#include "coload/device/pin.hpp"
#include "coload/device/pinned_pool.hpp"

namespace coload {
namespace detail {

namespace {
constexpr std::size_t kAlign = 64;
constexpr std::size_t kSlabGranule = std::size_t{64} << 10;  // slabs are multiples of 64 KiB
}  // namespace

struct PinnedSlab {
  char* data = nullptr;
  std::size_t size = 0;
};

/// The pool's state, shared with every leased slab so that a slab outliving the pool can
/// still come back (and be freed).
struct PinnedPoolState : std::enable_shared_from_this<PinnedPoolState> {
  PinnedPoolState(std::shared_ptr<DeviceBackend> b, std::size_t h) : backend(std::move(b)), hint(h) {}

  std::shared_ptr<DeviceBackend> backend;
  const std::size_t hint;

  mutable std::mutex mutex;
  std::vector<PinnedSlab> free;  // slabs not leased
  std::vector<PinnedSlab> live;  // every slab allocated and not freed
  std::size_t slab_size = 0;     // learned from the batches
  bool closed = false;           // the PinnedPool is gone
  PinnedPoolStats stats;         // slabs_live and slab_bytes are filled in by snapshot()

  /// A slab of at least `min_size` bytes, leased until the returned pointer's last copy dies.
  std::shared_ptr<PinnedSlab> acquire(std::size_t min_size) {
    std::optional<PinnedSlab> victim;
    std::size_t size = 0;
    {
      std::lock_guard lock(mutex);
      auto best = free.end();
      for (auto it = free.begin(); it != free.end(); ++it) {
        if (it->size >= min_size && (best == free.end() || it->size < best->size)) best = it;
      }
      if (best != free.end()) {
        PinnedSlab s = *best;
        free.erase(best);
        ++stats.slabs_in_use;
        ++stats.slabs_reused;
        return lease(s);
      }
      if (!free.empty()) {
        // Every free slab is too small: the largest makes room for a bigger one.
        auto largest = std::max_element(free.begin(), free.end(),
                                        [](const PinnedSlab& a, const PinnedSlab& b) { return a.size < b.size; });
        victim = *largest;
        free.erase(largest);
        forget(victim->data);
        ++stats.slabs_replaced;
      }
      size = round_up(std::max({min_size, slab_size, std::size_t{1}}), kSlabGranule);
      if (live.size() >= hint) ++stats.slabs_over_hint;
      // NOTE: counted as in use now, so that a concurrent acquire sees the hint reached.
      ++stats.slabs_in_use;
    }
    if (victim) backend->free_pinned(victim->data, victim->size);
    void* p = nullptr;
    try {
      p = backend->alloc_pinned(size);
    } catch (...) {
      std::lock_guard lock(mutex);
      --stats.slabs_in_use;
      throw;
    }
    PinnedSlab s{static_cast<char*>(p), size};
    {
      std::lock_guard lock(mutex);
      live.push_back(s);
      ++stats.slabs_allocated;
    }
    return lease(s);
  }

  std::shared_ptr<PinnedSlab> lease(PinnedSlab s) {
    return std::shared_ptr<PinnedSlab>(new PinnedSlab(s), [self = shared_from_this()](PinnedSlab* p) {
      self->give_back(*p);
      delete p;
    });
  }

  /// A leased slab's last owner died: back to the free list, or freed when the pool is gone
  /// or holds more slabs than the hint.
  void give_back(PinnedSlab s) {
    bool release = false;
    {
      std::lock_guard lock(mutex);
      --stats.slabs_in_use;
      ++stats.slabs_recycled;
      release = closed || live.size() > hint;
      if (release) {
        forget(s.data);
      } else {
        free.push_back(s);
      }
    }
    if (release) backend->free_pinned(s.data, s.size);
  }

  /// A batch needed `bytes`: later slabs hold that much.
  void observe(std::size_t bytes) {
    std::lock_guard lock(mutex);
    slab_size = std::max(slab_size, round_up(bytes, kSlabGranule));
  }

  std::size_t learned_size() const {
    std::lock_guard lock(mutex);
    return slab_size;
  }

  void close() {
    std::vector<PinnedSlab> release;
    {
      std::lock_guard lock(mutex);
      closed = true;
      release.swap(free);
      for (const PinnedSlab& s : release) forget(s.data);
    }
    for (const PinnedSlab& s : release) backend->free_pinned(s.data, s.size);
  }

  bool owns(const void* p) const {
    const char* c = static_cast<const char*>(p);
    std::lock_guard lock(mutex);
    return std::any_of(live.begin(), live.end(),
                       [c](const PinnedSlab& s) { return c >= s.data && c < s.data + s.size; });
  }

  PinnedPoolStats snapshot() const {
    std::lock_guard lock(mutex);
    PinnedPoolStats s = stats;
    s.slabs_live = live.size();
    s.slab_bytes = slab_size;
    return s;
  }

 private:
  // Under the mutex.
  void forget(const char* data) {
    auto it = std::find_if(live.begin(), live.end(), [data](const PinnedSlab& s) { return s.data == data; });
    if (it != live.end()) live.erase(it);
  }
};

}  // namespace detail

// --- BatchLease ----------------------------------------------------------------------------------

BatchLease::BatchLease(std::shared_ptr<detail::PinnedPoolState> pool) : pool_(std::move(pool)) {}

BatchLease::~BatchLease() {
  if (total_ > 0) pool_->observe(total_);
}

void* BatchLease::allocate(std::size_t) { return nullptr; }

BatchMemory BatchLease::allocate_owned(std::size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  std::size_t offset = (used_ + detail::kAlign - 1) / detail::kAlign * detail::kAlign;
  if (!slab_ || offset + nbytes > slab_->size) {
    // The first slab of a batch is sized for a whole batch; another is taken only when the
    // batch outgrows it (the first batch, or a larger one).
    const std::size_t want = slab_ ? nbytes : std::max(nbytes, pool_->learned_size());
    slab_ = pool_->acquire(want);
    offset = 0;
  }
  used_ = offset + nbytes;
  total_ += (nbytes + detail::kAlign - 1) / detail::kAlign * detail::kAlign;
  BatchMemory m;
  m.data = slab_->data + offset;
  m.owner = slab_;
  return m;
}

at::Tensor BatchLease::copy_in(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu()) {
    throw InvalidArgument("BatchLease::copy_in: the tensor is not a defined CPU tensor");
  }
  const std::size_t nbytes = static_cast<std::size_t>(t.numel()) * t.element_size();
  BatchMemory m = allocate_owned(nbytes);
  at::Tensor out = at::from_blob(m.data, t.sizes(), [owner = std::move(m.owner)](void*) {},
                                 at::TensorOptions().dtype(t.scalar_type()));
  out.copy_(t);
  return out;
}

// --- PinnedPool ----------------------------------------------------------------------------------

PinnedPool::PinnedPool(std::shared_ptr<DeviceBackend> backend, std::size_t max_slabs_hint) {
  if (!backend) throw InvalidArgument("PinnedPool: the backend is null");
  state_ = std::make_shared<detail::PinnedPoolState>(std::move(backend), std::max<std::size_t>(max_slabs_hint, 1));
}

PinnedPool::~PinnedPool() { state_->close(); }

std::unique_ptr<BatchLease> PinnedPool::begin_batch() {
  return std::unique_ptr<BatchLease>(new BatchLease(state_));
}

bool PinnedPool::owns(const void* p) const { return state_->owns(p); }

bool PinnedPool::is_pinned(const void* p) const { return owns(p) || state_->backend->is_pinned(p); }

PinnedPoolStats PinnedPool::stats() const { return state_->snapshot(); }

DeviceBackend& PinnedPool::backend() const noexcept { return *state_->backend; }
const std::shared_ptr<DeviceBackend>& PinnedPool::backend_ptr() const noexcept { return state_->backend; }

void PinnedPool::count_foreign_pin() noexcept {
  std::lock_guard lock(state_->mutex);
  ++state_->stats.foreign_pins;
}

// --- Pinner --------------------------------------------------------------------------------------

at::Tensor Pinner::tensor(at::Tensor t) {
  if (!t.defined() || !t.device().is_cpu() || t.numel() == 0) return t;
  if (pool_.is_pinned(t.data_ptr())) return t;
  if (!lease_) lease_ = pool_.begin_batch();
  pool_.count_foreign_pin();
  return lease_->copy_in(t);
}

}  // namespace coload
