// The native loaders behind coload.DataLoader: one DataLoader instantiation per kind of
// dataset (a Python one, coload.TensorDataset, an image folder pipeline, tar shards), each
// behind the type-erased Loader that Python drives.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "binding.hpp"
#include "coload/coro/generator.hpp"
#include "coload/dataset/tensor_dataset.hpp"
#include "coload/loader/data_loader.hpp"
#include "coload/shards/dataset.hpp"
#include "coload/vision/pipeline.hpp"

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

/// A map-style Python dataset (`__getitem__`/`__len__`): each sample is fetched on a worker
/// thread that takes the GIL for the call only.
struct PyMapDataset {
  using sample_type = PyRef;
  std::shared_ptr<PyRef> dataset;
  std::int64_t length = 0;

  std::int64_t size() const noexcept { return length; }
  PyRef get(Index index) const {
    py::gil_scoped_acquire gil;
    DatasetScope scope(dataset->get().ptr());
    return PyRef(dataset->get()[py::int_(index)]);
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
      py::gil_scoped_acquire gil;
      DatasetScope scope(ds->get().ptr());
      it = PyRef(py::reinterpret_steal<py::object>(PyObject_GetIter(ds->get().ptr())));
      if (!it) throw py::error_already_set();
    }
    for (;;) {
      PyRef item;
      {
        py::gil_scoped_acquire gil;
        DatasetScope scope(ds->get().ptr());
        PyObject* next = PyIter_Next(it.get().ptr());
        if (next == nullptr) {
          if (PyErr_Occurred() != nullptr) throw py::error_already_set();
          break;
        }
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
    py::gil_scoped_acquire gil;
    DatasetScope scope(dataset->get().ptr());
    py::list list(samples.size());
    for (std::size_t i = 0; i < samples.size(); ++i) {
      list[i] = samples[i].take();
    }
    return PyRef(fn->get()(list));
  }
};

/// Shard samples are handed to Python as they are: dicts of bytes, keyed as WebDataset keys them.
struct ShardCollate {
  std::vector<shards::ShardSample> operator()(std::vector<shards::ShardSample> samples) const {
    return samples;
  }
};

/// Index lists from the Python shim (torch's samplers and batch samplers, or a user's): pulled
/// one list at a time on the loader's driver, with the GIL.
struct PyBatches {
  std::shared_ptr<PyRef> factory;
  std::optional<std::int64_t> length;

  std::optional<std::int64_t> size() const { return length; }
  Generator<std::vector<Index>> batches() {
    auto f = factory;
    PyRef it;
    {
      py::gil_scoped_acquire gil;
      it = PyRef(py::iter(f->get()()));
    }
    for (;;) {
      std::vector<Index> list;
      {
        py::gil_scoped_acquire gil;
        PyObject* next = PyIter_Next(it.get().ptr());
        if (next == nullptr) {
          if (PyErr_Occurred() != nullptr) throw py::error_already_set();
          break;
        }
        auto batch = py::reinterpret_steal<py::object>(next);
        for (auto index : batch) list.push_back(index.cast<Index>());
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
  LoaderImpl(D dataset, LoaderOptions<C> options) {
    py::gil_scoped_release nogil;  // the constructor starts threads that may want the GIL
    loader_.emplace(std::move(dataset), std::move(options));
  }
  ~LoaderImpl() override { close(); }

  void close() override {
    // Joining the workers waits for fetches that may need the GIL.
    py::gil_scoped_release nogil;
    epoch_.reset();
    loader_.reset();
  }

  std::int64_t size() const override { return open().size(); }
  void start_epoch() override {
    open();
    py::gil_scoped_release nogil;
    epoch_.reset();
    epoch_.emplace(loader_->epoch());
  }
  void stop_epoch() override {
    py::gil_scoped_release nogil;
    epoch_.reset();
  }

  py::object next() override {
    open();
    if (!epoch_) return py::none();
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

  std::string state() const override { return open().state().to_string(); }
  void load_state(const std::string& text) override {
    open().load_state(LoaderState::parse(text));
  }
  std::string metrics_json(bool total) const override {
    return (total ? open().total_metrics() : open().metrics()).to_json();
  }
  std::string verdict() const override { return open().metrics().report(); }
  std::int64_t skipped() const override { return open().skipped(); }
  int workers() const override { return open().worker_tuning().workers; }

 private:
  Native& open() const {
    if (!loader_) throw LogicError("coload.DataLoader: the loader was closed");
    return const_cast<Native&>(*loader_);
  }

  std::optional<Native> loader_;
  std::optional<Epoch<Batch>> epoch_;
};

template <class C>
LoaderOptions<C> native_options(const Options& o, C collate, std::shared_ptr<PyRef> dataset) {
  LoaderOptions<C> out;
  if (o.batches) {
    out.batch_sampler = AnyBatchSampler(std::make_shared<PyBatches>(
        PyBatches{std::make_shared<PyRef>(o.batches), o.batches_len}));
  } else {
    out.batch_size = o.batch_size;
    out.drop_last = o.drop_last;
  }
  out.num_workers = o.auto_workers ? coload::auto_workers : o.num_workers;
  out.collate = std::move(collate);
  out.pin_memory = o.pin_memory;
  out.timeout = o.timeout;
  if (o.worker_init_fn) {
    auto fn = std::make_shared<PyRef>(o.worker_init_fn);
    out.worker_init_fn = [fn, dataset](const WorkerInfo& info) {
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
  return std::make_unique<LoaderImpl<D, C>>(std::move(dataset),
                                            native_options(o, std::move(collate), pydataset));
}

void refuse_native(const Options& o, const char* what) {
  if (o.collate) {
    throw InvalidArgument(std::string("collate_fn is not supported with ") + what +
                          ", whose batches are collated natively; wrap it in a Python dataset");
  }
}

}  // namespace

PyObject* worker_dataset() noexcept { return current_dataset; }

std::unique_ptr<Loader> make_loader(py::object dataset, Options options) {
  if (py::isinstance<TensorDataset>(dataset)) {
    refuse_native(options, "coload.TensorDataset");
    return make(dataset.cast<TensorDataset>(), options, DefaultCollate{});
  }
  if (py::isinstance<vision::ImagePipeline>(dataset)) {
    refuse_native(options, "coload.vision.ImageFolder");
    return make(dataset.cast<vision::ImagePipeline>(), options, DefaultCollate{});
  }
  if (py::isinstance<shards::ShardDataset>(dataset)) {
    refuse_native(options, "coload.shards.ShardDataset");
    if (options.executor == "processes") {
      throw InvalidArgument("executor='processes' is not supported for ShardDataset from Python");
    }
    return make(dataset.cast<shards::ShardDataset>(), options, ShardCollate{});
  }
  if (options.executor == "processes") {
    // NOTE: a forked child of this multi-threaded interpreter cannot safely run Python (the GIL
    // and the interpreter's locks are copied in whatever state other threads left them).
    throw InvalidArgument(
        "executor='processes' is not supported yet for Python datasets (only for coload's "
        "native datasets); use executor='threads'");
  }
  if (!options.collate) throw InvalidArgument("a Python dataset needs a collate_fn");
  auto ds = std::make_shared<PyRef>(py::object(dataset));
  auto collate = PyCollate{std::make_shared<PyRef>(options.collate), ds};
  if (py::isinstance(dataset, py::module_::import("torch.utils.data").attr("IterableDataset"))) {
    return make(PyIterableDataset{ds}, options, std::move(collate), ds);
  }
  const auto length = py::len(dataset);
  return make(PyMapDataset{ds, static_cast<std::int64_t>(length)}, options, std::move(collate), ds);
}

}  // namespace coload::python
