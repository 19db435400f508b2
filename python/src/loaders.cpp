// The native loaders behind coload.DataLoader: one DataLoader instantiation per kind of
// dataset (a Python one, coload.TensorDataset, an image folder pipeline, tar shards), each
// behind the type-erased Loader that Python drives.

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "binding.hpp"
#include "coload/core/worker_info.hpp"
#include "coload/coro/generator.hpp"
#include "coload/dataset/tensor_dataset.hpp"
#include "coload/exec/fork.hpp"
#include "coload/loader/data_loader.hpp"
#include "coload/shards/dataset.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/vision/shard_pipeline.hpp"

namespace coload::python {

namespace {

/// The Python dataset that the calling worker thread serves, for get_worker_info().dataset.
thread_local PyObject* current_dataset = nullptr;

struct DatasetScope {
  explicit DatasetScope(PyObject* ds) noexcept : saved(std::exchange(current_dataset, ds)) {}
  ~DatasetScope() { current_dataset = saved; }
  DatasetScope(const DatasetScope&) = delete;
  DatasetScope& operator=(const DatasetScope&) = delete;
  PyObject* saved;
};

/// True in a worker process forked by python_fork: its Python exceptions travel to the parent
/// as PythonError, and the loaders it inherited are the parent's (never closed here).
bool in_worker_process = false;
/// In a worker process, until the first Python call: PyOS_AfterFork_Child has not run yet.
bool child_python_pending = false;

/// Forks a worker process as os.fork() does: with the GIL taken and PyOS_BeforeFork's locks
/// held, so that the child's interpreter starts consistent. The child keeps the GIL for good:
/// it has no other thread, and runs the dataset's Python code on this one.
pid_t python_fork() {
  if (Py_IsInitialized() == 0) return ::fork();
  const PyGILState_STATE gil = PyGILState_Ensure();
  // gc.freeze, looked up here: the child calls it before anything else (kept for good).
  static PyObject* const freeze = [] {
    PyObject* gc = PyImport_ImportModule("gc");
    PyObject* f = gc != nullptr ? PyObject_GetAttrString(gc, "freeze") : nullptr;
    Py_XDECREF(gc);
    PyErr_Clear();  // never seen (gc is built in): the children go unfrozen
    return f;
  }();
  PyOS_BeforeFork();
  const pid_t pid = ::fork();
  const int err = errno;
  if (pid == 0) {
    // NOTE: PyOS_AfterFork_Child (which makes this thread the interpreter's only, main one and
    // runs Python's at-fork hooks) waits for the child's first Python call: a worker of a
    // native dataset never makes one, and so never runs Python code, whose collector could
    // otherwise finalise objects of the parent's (see LoaderImpl::close).
    // Every object the child inherited moves to the collector's permanent generation at once,
    // as Python's gc.freeze() documents for fork without exec, before any Python code (the
    // at-fork hooks) could run a collection: the child's collector would otherwise finalise
    // the parent's garbage cycles with the parent's native state (a batch tensor's slot lease
    // took its arena's mutex, which another of the parent's threads may have held at the fork,
    // and the worker hung). Frozen, they are the parent's alone to collect. A builtin's call
    // runs no Python code, takes none of the locks the fork left held and allocates nothing.
#ifndef Py_GIL_DISABLED  // a free-threaded build's freeze stops the world, which the fork held
    if (freeze != nullptr) {
      PyObject* none = PyObject_CallNoArgs(freeze);
      if (none == nullptr) PyErr_Clear();  // never seen: the child goes on unfrozen
      Py_XDECREF(none);
    }
#endif
    in_worker_process = true;
    child_python_pending = true;
    return 0;
  }
  PyOS_AfterFork_Parent();
  PyGILState_Release(gil);
  errno = err;
  return pid;
}

/// A map-style Python dataset (`__getitem__`/`__len__`): each sample is fetched on a worker
/// thread that takes the GIL for the call only.
struct PyMapDataset {
  using sample_type = PyRef;
  std::shared_ptr<PyRef> dataset;
  /// len(dataset); the most an Index can be where the dataset's own __getitem__ tells what is
  /// out of range. Where torch's samplers give the indices (`follows`), read again as each
  /// epoch starts, by each len(loader) and load_state, as those samplers read it (a dataset
  /// may grow between epochs); the loader's own order keeps the length it was made with (the
  /// Python DataLoader makes a loader again where that length changed).
  std::shared_ptr<std::atomic<std::int64_t>> length;
  bool follows = false;

  std::int64_t size() const noexcept { return length->load(std::memory_order_relaxed); }
  /// Reads len(dataset) again (GIL held).
  void refresh() const {
    if (follows) length->store(static_cast<std::int64_t>(py::len(dataset->get())));
  }
  PyRef get(Index index) const {
    enter_python();
    py::gil_scoped_acquire gil;
    DatasetScope scope(dataset->get().ptr());
    return call_python([&] { return PyRef(dataset->get()[py::int_(index)]); });
  }
};

/// An IterableDataset: each worker iterates `iter(dataset)` (get_worker_info() tells it which
/// worker it is, as in PyTorch), taking the GIL for each `next`.
struct PyIterableDataset {
  using sample_type = PyRef;
  std::shared_ptr<PyRef> dataset;

  Generator<PyRef> stream(const WorkerInfo& /*info*/) {
    auto ds = dataset;  // the coroutine outlives no copy of it
    PyRef it;
    {
      enter_python();
      py::gil_scoped_acquire gil;
      DatasetScope scope(ds->get().ptr());
      it = call_python([&] {
        PyRef made(py::reinterpret_steal<py::object>(PyObject_GetIter(ds->get().ptr())));
        if (!made) throw py::error_already_set();
        return made;
      });
    }
    for (;;) {
      PyRef item;
      {
        enter_python();
        py::gil_scoped_acquire gil;
        DatasetScope scope(ds->get().ptr());
        PyObject* next = call_python([&] {
          PyObject* got = PyIter_Next(it.get().ptr());
          if (got == nullptr && PyErr_Occurred() != nullptr) throw py::error_already_set();
          return got;
        });
        if (next == nullptr) break;
        item = PyRef(py::reinterpret_steal<py::object>(next));
      }
      co_yield std::move(item);
    }
  }
};

/// A Python collate_fn over Python samples, called with the GIL on the worker.
struct PyCollate {
  std::shared_ptr<PyRef> fn;
  std::shared_ptr<PyRef> dataset;
  PyRef operator()(std::vector<PyRef> samples) const {
    enter_python();
    py::gil_scoped_acquire gil;
    DatasetScope scope(dataset->get().ptr());
    return call_python([&] {
      py::list list(samples.size());
      for (std::size_t i = 0; i < samples.size(); ++i) {
        list[i] = samples[i].take();
      }
      return PyRef(fn->get()(list));
    });
  }
};

/// A batch of a Python dataset on its way from a worker process: the batch pickled without its
/// tensors (coload._process.dumps), and the tensors, which the wire format writes into the
/// worker's shared-memory slot and the parent reads over it without a copy.
using WireBatch = std::pair<std::string, std::vector<at::Tensor>>;

/// PyCollate in a worker process: the collate_fn's batch, made ready to cross.
struct PyWireCollate {
  std::shared_ptr<PyRef> fn;
  std::shared_ptr<PyRef> dataset;
  WireBatch operator()(std::vector<PyRef> samples) const {
    enter_python();
    py::gil_scoped_acquire gil;
    DatasetScope scope(dataset->get().ptr());
    return call_python([&] {
      py::list list(samples.size());
      for (std::size_t i = 0; i < samples.size(); ++i) list[i] = samples[i].take();
      auto packed =
          py::module_::import("coload._process").attr("dumps")(fn->get()(list)).cast<py::tuple>();
      WireBatch out;
      out.first = packed[0].cast<std::string>();
      for (auto t : py::list(packed[1])) out.second.push_back(t.cast<at::Tensor>());
      return out;
    });
  }
};

/// Shard samples are handed to Python as they are: dicts of bytes, keyed as WebDataset keys them.
struct ShardCollate {
  std::vector<shards::ShardSample> operator()(std::vector<shards::ShardSample> samples) const {
    return samples;
  }
};

/// The index iterators of the epochs started and not yet begun on the driver, oldest first.
/// Epochs begin on the driver in the order they started, each asking for its batches once
/// (even one stopped before it began), so each takes its own: an epoch stopped by the next
/// iter() cannot take the next epoch's iterator.
struct EpochIndices {
  std::mutex mutex;
  std::deque<PyRef> waiting;
};

/// Reads a Python dataset's length again (GIL held); a native dataset's size is its own.
template <class D>
void refresh_size(const D& /*dataset*/) {}
void refresh_size(const PyMapDataset& dataset) { dataset.refresh(); }

/// Index lists from the Python shim (torch's samplers and batch samplers, or a user's): pulled
/// one list at a time on the loader's driver, with the GIL.
struct PyBatches {
  std::shared_ptr<EpochIndices> indices;
  std::optional<std::int64_t> length;

  std::optional<std::int64_t> size() const { return length; }
  Generator<std::vector<Index>> batches() {
    PyRef it;
    {
      std::lock_guard lock(indices->mutex);
      if (indices->waiting.empty()) {
        throw LogicError("coload.DataLoader: an epoch began without its index iterator");
      }
      it = std::move(indices->waiting.front());
      indices->waiting.pop_front();
    }
    return pull(std::move(it));
  }

 private:
  static Generator<std::vector<Index>> pull(PyRef given) {
    PyRef it;
    {
      py::gil_scoped_acquire gil;
      it = PyRef(py::iter(given.get()));
    }
    for (std::int64_t n = 0;; ++n) {
      std::vector<Index> list;
      {
        py::gil_scoped_acquire gil;
        const bool more = call_python([&] {
          PyObject* next = PyIter_Next(it.get().ptr());
          if (next == nullptr) {
            if (PyErr_Occurred() != nullptr) throw py::error_already_set();
            return false;
          }
          auto batch = py::reinterpret_steal<py::object>(next);
          for (auto index : batch) {
            try {
              list.push_back(index.cast<Index>());
            } catch (const py::cast_error&) {
              // NOTE: torch's fetcher hands any key to __getitem__; coload's indices travel as
              // integers (to its workers, in its state), so a key is refused by name.
              throw py::type_error(
                  "coload.DataLoader: the batch_sampler gave " +
                  py::repr(index).cast<std::string>() + " (" +
                  py::str(py::type::of(index).attr("__qualname__")).cast<std::string>() +
                  ") in batch " + std::to_string(n) +
                  ", which is not a 64-bit integer index; coload's loader takes those only "
                  "(map other keys to integers in the dataset's __getitem__)");
            }
          }
          return true;
        });
        if (!more) break;
      }
      co_yield std::move(list);
    }
  }
};

py::object to_python(std::vector<at::Tensor>&& batch) {
  py::list out(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) out[i] = py::cast(std::move(batch[i]));
  return out;
}
py::object to_python(std::pair<at::Tensor, at::Tensor>&& batch) {
  py::list out(2);
  out[0] = py::cast(std::move(batch.first));
  out[1] = py::cast(std::move(batch.second));
  return out;
}
py::object to_python(PyRef&& batch) { return batch.take(); }
py::object to_python(WireBatch&& batch) {
  py::list tensors(batch.second.size());
  for (std::size_t i = 0; i < batch.second.size(); ++i) {
    tensors[i] = py::cast(std::move(batch.second[i]));
  }
  return py::module_::import("coload._process")
      .attr("loads")(py::bytes(batch.first), std::move(tensors));
}
py::object to_python(std::vector<shards::ShardSample>&& batch) {
  py::list out(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const auto& s = batch[i];
    py::dict d;
    d["__key__"] = s.key;
    d["__url__"] = s.shard;
    for (const auto& f : s.fields) {
      const auto bytes = s.field(f.name);
      d[py::str(f.name)] = py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    }
    out[i] = std::move(d);
  }
  return out;
}

/// An interrupt (KeyboardInterrupt, SystemExit) raised in Python code that a loader without
/// workers runs on the consumer's own thread, while it runs there (Interrupts).
struct Interrupt {
  std::optional<py::error_already_set> error;
  /// Stops the epoch being fetched, at once: the rest of the batch is not fetched (nor, with
  /// on_error = skip, skipped), and the batch is not counted as delivered.
  std::function<void()> stop;
};

/// Where note_interrupt keeps an interrupt on this thread (null: nowhere; it is then the
/// dataset's error, as on a worker thread, where Python raises no signal's exception).
thread_local Interrupt* interrupt_slot = nullptr;

/// Keeps the interrupts raised on this thread while it lives (nests), and raises the first
/// one after it (raise_if_any).
class Interrupts {
 public:
  explicit Interrupts(std::function<void()> stop = {}) : previous_(interrupt_slot) {
    interrupt_.stop = std::move(stop);
    interrupt_slot = &interrupt_;
  }
  Interrupts(const Interrupts&) = delete;
  Interrupts& operator=(const Interrupts&) = delete;
  ~Interrupts() { interrupt_slot = previous_; }
  bool raised() const noexcept { return interrupt_.error.has_value(); }
  /// Raises the interrupt kept, if any (GIL held).
  void raise_if_any() {
    if (!interrupt_.error) return;
    interrupt_slot = previous_;
    py::error_already_set error = std::move(*interrupt_.error);
    interrupt_.error.reset();
    error.restore();
    throw py::error_already_set();
  }

 private:
  Interrupt interrupt_;
  Interrupt* previous_;
};

/// What a waiting consumer shares with the loader's hand-off: owned jointly, so that a wait
/// abandoned by Ctrl-C leaves the slot alive until the loader lets go of it.
template <class Batch>
struct Wait {
  detail::ConsumerSlot<Batch> slot;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
};

template <class D, class C>
class LoaderImpl final : public Loader {
  using Native = DataLoader<D, C>;
  using Batch = typename Native::batch_type;

 public:
  LoaderImpl(D dataset, LoaderOptions<C> options, std::shared_ptr<EpochIndices> indices)
      : indices_(std::move(indices)) {
    py::gil_scoped_release nogil;  // the constructor starts threads that may want the GIL
    loader_ = std::make_unique<Native>(std::move(dataset), std::move(options));
  }
  ~LoaderImpl() override { close(); }

  void close() override {
    if (in_worker_process) {
      // A worker process's copy of a parent's loader (dropped by Python's collector there): its
      // threads and workers are the parent's, so it is left as it is, never closed.
      (void)epoch_.release();
      (void)loader_.release();
      return;
    }
    if (coload::get_worker_info() && (epoch_ || loader_)) {
      // Closed on a worker thread: Python's collector runs on whichever thread allocates, and
      // can finalize a loader in a cycle (collate_fn=self.collate) on one of its own workers,
      // busy in this very call. Waiting here for that fetch to end would wait out the stop's
      // grace and warn of a stuck fetch: a thread of its own lets go of the loader instead, as
      // DataLoader::release does on the driver thread.
      std::thread([epoch = std::move(epoch_), loader = std::move(loader_)]() mutable {
        epoch.reset();
        loader.reset();
      }).detach();
      return;
    }
    // Joining the workers waits for fetches that may need the GIL.
    py::gil_scoped_release nogil;
    epoch_.reset();
    loader_.reset();
  }

  std::int64_t size() const override {
    Native& n = open();
    refresh_size(n.dataset());
    py::gil_scoped_release nogil;
    return n.size();
  }
  void start_epoch(py::object indices, std::optional<std::uint64_t> base_seed) override {
    refresh_size(open().dataset());
    if (static_cast<bool>(indices_) == indices.is_none()) {
      throw InvalidArgument(indices_ ? "start_epoch: this loader's epochs need their indices"
                                     : "start_epoch: this loader orders its own indices");
    }
    if (indices_) {
      std::lock_guard lock(indices_->mutex);
      indices_->waiting.emplace_back(std::move(indices));
    }
    Interrupts interrupts;  // raised in the stopped epoch's sampler, here (see stop_epoch)
    {
      py::gil_scoped_release nogil;
      epoch_.reset();
      try {
        epoch_ = std::make_unique<Epoch<Batch>>(base_seed ? loader_->epoch(*base_seed)
                                                          : loader_->epoch());
      } catch (...) {
        // Not started: no epoch will take the iterator just queued.
        if (indices_) {
          PyRef dropped;  // dropped (GIL taken) after the lock
          std::lock_guard lock(indices_->mutex);
          dropped = std::move(indices_->waiting.back());
          indices_->waiting.pop_back();
        }
        throw;
      }
    }
    if (interrupts.raised()) {
      stop_epoch();  // the epoch just started, which the caller will not take
      interrupts.raise_if_any();
    }
  }
  void stop_epoch() override {
    // Without workers the stopped epoch's sampler may run here, on this thread: an interrupt
    // raised in it is raised after the stop, as it is.
    Interrupts interrupts;
    {
      py::gil_scoped_release nogil;
      epoch_.reset();
      // The stopped epoch's driver may still be in the index iterator's last call (torch's
      // RandomSampler draws its trailing permutation there): the front end reads the
      // generator next.
      if (loader_) loader_->wait_stopped_epoch();
    }
    interrupts.raise_if_any();
  }

  py::object next() override {
    Native& n = open();
    if (!epoch_) return py::none();
    if (n.fetches_here()) return next_here(n);
    auto channel = epoch_->channel();
    auto wait = std::make_shared<Wait<Batch>>();
    bool interrupted = false;
    {
      py::gil_scoped_release nogil;
      if (channel->recorder && channel->recorder->shard_count() > 0) {
        wait->slot.asked_ns = detail::now_ns();
      }
      channel->before_wait();
      const bool waiting = channel->handoff.poll_or_wait(
          wait->slot,
          [wait] {
            std::lock_guard lock(wait->mutex);
            wait->done = true;
            wait->cv.notify_all();
          },
          [c = channel.get()](std::uint64_t generation, std::int64_t batch) {
            c->arm_timeout(generation, batch);
          });
      // Wakes every 50 ms to run Python's signal handlers: Ctrl-C stops the epoch promptly.
      while (waiting) {
        std::unique_lock lock(wait->mutex);
        if (wait->cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return wait->done; })) {
          break;
        }
        lock.unlock();
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) {
          interrupted = true;
          break;
        }
      }
    }
    if (interrupted) {
      py::error_already_set error;  // KeyboardInterrupt, fetched before the GIL is let go
      stop_epoch();
      throw error;
    }
    std::optional<Batch> batch;
    {
      py::gil_scoped_release nogil;
      batch = detail::take_outcome(*channel, wait->slot);  // rethrows the batch's error
      if (!batch) epoch_.reset();
    }
    if (!batch) return py::none();
    return to_python(std::move(*batch));
  }

  /// next() of a loader without workers (DataLoader::fetches_here): the batch is fetched on
  /// this thread, Python's, in this call and not before it, as torch's num_workers=0 fetches.
  /// The dataset then sees the caller's thread-local state (grad mode, a sqlite connection)
  /// and draws from the global generators in turn with the training loop. Ctrl-C raises
  /// KeyboardInterrupt in the dataset's code, here: it stops the epoch and is raised as it is,
  /// as the wait of a loader with workers raises it.
  py::object next_here(Native& n) {
    // The stop records where the epoch stands before the batch is delivered: a state taken
    // after the interrupt fetches that batch again.
    Interrupts interrupts([channel = epoch_->channel()] { channel->cancel(); });
    std::optional<Batch> batch;
    try {
      py::gil_scoped_release nogil;
      batch = n.next(*epoch_);  // rethrows the batch's error
      if (!batch) epoch_.reset();
    } catch (...) {
      if (!interrupts.raised()) throw;  // else the loader's error for the interrupt: dropped
    }
    if (interrupts.raised()) {
      stop_epoch();
      interrupts.raise_if_any();
    }
    if (!batch) return py::none();
    return to_python(std::move(*batch));
  }

  // NOTE: each call that may wait for the driver lets the GIL go: the driver takes it to pull
  // index lists and to fork worker processes.
  std::string state() const override {
    Native& n = open();
    py::gil_scoped_release nogil;
    return n.state().to_string();
  }
  void load_state(const std::string& text) override {
    Native& n = open();
    refresh_size(n.dataset());  // what the state's dataset size is checked against
    py::gil_scoped_release nogil;
    n.load_state(LoaderState::parse(text));
  }
  std::int64_t state_epoch() const override {
    Native& n = open();
    py::gil_scoped_release nogil;
    return n.state().epoch;
  }
  void begin_at_epoch(std::int64_t epoch) override {
    Native& n = open();
    refresh_size(n.dataset());
    py::gil_scoped_release nogil;
    LoaderState s = n.state();  // its own: compatible
    s.epoch = epoch;
    s.delivered = 0;
    s.beyond.clear();
    s.streams.clear();
    s.last_stream = -1;
    n.load_state(s);
  }
  std::string metrics_json(bool total) const override {
    Native& n = open();
    py::gil_scoped_release nogil;
    return (total ? n.total_metrics() : n.metrics()).to_json();
  }
  std::string verdict() const override {
    Native& n = open();
    py::gil_scoped_release nogil;
    return n.metrics().report();
  }
  std::int64_t skipped() const override {
    Native& n = open();
    py::gil_scoped_release nogil;
    return n.skipped();
  }
  int workers() const override {
    Native& n = open();
    py::gil_scoped_release nogil;
    return n.worker_tuning().workers;
  }

 private:
  Native& open() const {
    if (!loader_) throw LogicError("coload.DataLoader: the loader was closed");
    return const_cast<Native&>(*loader_);
  }

  std::shared_ptr<EpochIndices> indices_;  // null: the loader orders its own indices
  // NOTE: owned through pointers, so that a worker process can leave them unclosed (close()).
  std::unique_ptr<Native> loader_;
  std::unique_ptr<Epoch<Batch>> epoch_;
};

template <class C>
LoaderOptions<C> native_options(const Options& o, C collate, std::shared_ptr<PyRef> dataset,
                                const std::shared_ptr<EpochIndices>& indices) {
  LoaderOptions<C> out;
  if (indices) {
    out.batch_sampler =
        AnyBatchSampler(std::make_shared<PyBatches>(PyBatches{indices, o.batches_len}));
  } else {
    out.batch_size = o.batch_size;
    out.drop_last = o.drop_last;
  }
  out.num_workers = o.auto_workers ? coload::auto_workers : o.num_workers;
  out.collate = std::move(collate);
  out.pin_memory = o.pin_memory;
  out.timeout = o.timeout;
  if (o.executor == "processes" && dataset) {
    // A worker process of a Python dataset starts as torch's do (coload._process.init_worker):
    // seeded, torch's get_worker_info() set, then the user's worker_init_fn.
    auto fn = std::make_shared<PyRef>(o.worker_init_fn);
    out.worker_init_fn = [fn, dataset](const WorkerInfo& info) {
      enter_python();
      py::gil_scoped_acquire gil;
      DatasetScope scope(dataset->get().ptr());
      call_python([&] {
        py::module_::import("coload._process")
            .attr("init_worker")(info.id, info.num_workers, info.seed, dataset->get(),
                                 *fn ? fn->get() : py::none());
      });
    };
  } else if (o.worker_init_fn) {
    auto fn = std::make_shared<PyRef>(o.worker_init_fn);
    out.worker_init_fn = [fn, dataset](const WorkerInfo& info) {
      enter_python();
      py::gil_scoped_acquire gil;
      DatasetScope scope(dataset ? dataset->get().ptr() : nullptr);
      fn->get()(info.id);
    };
  }
  out.prefetch_factor = o.prefetch_factor;
  out.persistent_workers = o.persistent_workers;
  out.in_order = o.in_order;
  out.seed = o.seed;
  if (o.on_error == "skip") {
    out.on_error = OnError::skip;
  } else if (o.on_error != "raise") {
    throw InvalidArgument("on_error must be 'raise' or 'skip', got '" + o.on_error + "'");
  }
  if (o.executor == "processes") {
    out.executor = Executor::processes;
  } else if (o.executor != "threads") {
    throw InvalidArgument("executor must be 'threads' or 'processes', got '" + o.executor + "'");
  }
  return out;
}

template <class D, class C>
std::unique_ptr<Loader> make(D dataset, const Options& o, C collate,
                             std::shared_ptr<PyRef> pydataset = nullptr) {
  auto indices = o.batches ? std::make_shared<EpochIndices>() : nullptr;
  return std::make_unique<LoaderImpl<D, C>>(
      std::move(dataset), native_options(o, std::move(collate), pydataset, indices), indices);
}

void refuse_native(const Options& o, const char* what) {
  if (o.collate) {
    throw InvalidArgument(std::string("collate_fn is not supported with ") + what +
                          ", whose batches are collated natively; wrap it in a Python dataset");
  }
}

}  // namespace

void enter_python() {
  if (child_python_pending) {
    child_python_pending = false;
    PyOS_AfterFork_Child();
  }
}

void note_interrupt(const py::error_already_set& e) {
  if (interrupt_slot == nullptr || interrupt_slot->error || e.matches(PyExc_Exception)) return;
  interrupt_slot->error = e;
  if (interrupt_slot->stop) interrupt_slot->stop();
}

void rethrow_python(py::error_already_set& e) {
  if (!in_worker_process) throw;
  std::string text;
  std::string type = "Exception";
  try {
    py::object cls = e.type();
    type = py::str(cls.attr("__qualname__")).cast<std::string>();
    const auto module = py::str(cls.attr("__module__")).cast<std::string>();
    if (module != "builtins") type = module + "." + type;
    py::object trace = e.trace() ? py::object(e.trace()) : py::object(py::none());
    py::object lines = py::module_::import("traceback")
                           .attr("format_exception")(cls, e.value(), trace);
    text = py::str(py::str("").attr("join")(lines)).cast<std::string>();
  } catch (py::error_already_set& inner) {
    text = std::string(e.what()) + " (its traceback could not be formatted: " +
           inner.what() + ")";
  }
  throw PythonError(type + "\n" + text);
}

PyObject* worker_dataset() noexcept { return current_dataset; }

void install_fork() { set_worker_fork(&python_fork); }

std::unique_ptr<Loader> make_loader(py::object dataset, Options options) {
  if (py::isinstance<TensorDataset>(dataset)) {
    refuse_native(options, "coload.TensorDataset");
    return make(dataset.cast<TensorDataset>(), options, DefaultCollate{});
  }
  if (py::isinstance<vision::ImagePipeline>(dataset)) {
    refuse_native(options, "coload.vision.ImageFolder");
    return make(dataset.cast<vision::ImagePipeline>(), options, DefaultCollate{});
  }
  if (py::isinstance<vision::ShardImagePipeline>(dataset)) {
    refuse_native(options, "coload.shards.ShardImageFolder");
    return make(dataset.cast<vision::ShardImagePipeline>(), options, DefaultCollate{});
  }
  if (py::isinstance<shards::ShardDataset>(dataset)) {
    refuse_native(options, "coload.shards.ShardDataset");
    if (options.executor == "processes") {
      throw InvalidArgument("executor='processes' is not supported for ShardDataset from Python");
    }
    return make(dataset.cast<shards::ShardDataset>(), options, ShardCollate{});
  }
  if (!options.collate) throw InvalidArgument("a Python dataset needs a collate_fn");
  auto ds = std::make_shared<PyRef>(py::object(dataset));
  auto fn = std::make_shared<PyRef>(options.collate);
  const bool iterable =
      py::isinstance(dataset, py::module_::import("torch.utils.data").attr("IterableDataset"));
  // A map-style dataset without __len__ is torch's too where a sampler names the indices: its
  // own __getitem__ then tells an index out of range. Without a sampler, len() raises here as
  // torch's SequentialSampler does.
  const bool sized = !iterable && !(options.batches && !py::hasattr(dataset, "__len__"));
  const bool follows = sized && options.batches;  // see PyMapDataset::length
  const auto length = std::make_shared<std::atomic<std::int64_t>>(
      sized ? static_cast<std::int64_t>(py::len(dataset))
            : std::numeric_limits<std::int64_t>::max());
  // executor="processes": workers forked by python_fork (as os.fork() forks torch's workers)
  // run the dataset and collate_fn with the GIL, and the batch crosses as a WireBatch.
  if (options.executor == "processes") {
    auto collate = PyWireCollate{fn, ds};
    if (iterable) return make(PyIterableDataset{ds}, options, std::move(collate), ds);
    return make(PyMapDataset{ds, length, follows}, options, std::move(collate), ds);
  }
  auto collate = PyCollate{fn, ds};
  if (iterable) return make(PyIterableDataset{ds}, options, std::move(collate), ds);
  return make(PyMapDataset{ds, length, follows}, options, std::move(collate), ds);
}

}  // namespace coload::python
