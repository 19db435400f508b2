#pragma once
// What the binding's two translation units share: Python references that any thread may drop,
// the Python-facing loader interface, and the options Python hands over.
//
// NOTE: torch's pybind.h brings torch's own casters (at::Tensor <-> torch.Tensor, without a
// copy: the Python tensor shares the C++ tensor's storage, which frees coload's slab when the
// last reference goes). It costs ~30 s per translation unit, so there are only two.

#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace coload::python {

namespace py = pybind11;

/// A strong reference to a Python object that any thread may copy, move and drop: copying and
/// dropping take the GIL. Samples and batches of Python datasets travel through the loader as
/// these, between worker threads that hold no GIL.
class PyRef {
 public:
  PyRef() = default;
  explicit PyRef(py::object o) noexcept : p_(o.release().ptr()) {}
  PyRef(const PyRef& other) : p_(other.p_) {
    if (p_) {
      py::gil_scoped_acquire gil;
      Py_INCREF(p_);
    }
  }
  PyRef(PyRef&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  PyRef& operator=(PyRef other) noexcept {
    std::swap(p_, other.p_);
    return *this;
  }
  ~PyRef() { reset(); }
  void reset() noexcept {
    // NOTE: after the interpreter has gone (a loader's detached thread at exit) the reference
    // is leaked rather than dropped, as taking the GIL then would never return.
    if (p_ && Py_IsInitialized() != 0) {
      py::gil_scoped_acquire gil;
      Py_DECREF(p_);
    }
    p_ = nullptr;
  }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  /// A new reference (GIL held).
  py::object get() const { return py::reinterpret_borrow<py::object>(p_); }
  /// Hands the reference over (GIL held).
  py::object take() noexcept { return py::reinterpret_steal<py::object>(std::exchange(p_, nullptr)); }

 private:
  PyObject* p_ = nullptr;
};

/// A Python exception raised in a worker process (executor="processes"), as it travels to the
/// parent: what() is its type's name, a newline, and its traceback as Python prints it. The
/// translator makes them the SampleError's message, `original_type` and `traceback`.
class PythonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Readies the interpreter of a worker process for its first Python call (see python_fork in
/// loaders.cpp); nothing elsewhere. Before any GIL is taken on a worker's thread.
void enter_python();

/// Rethrows the Python exception `e` (being handled): as it is, or in a worker process as a
/// PythonError, which carries the exception's type name and traceback text to the parent (the
/// exception object itself cannot cross).
[[noreturn]] void rethrow_python(py::error_already_set& e);

/// Keeps `e` (GIL held) for the consumer that fetches on its own thread (a loader without
/// workers) when it is no error of the dataset's but Python's own stop (KeyboardInterrupt,
/// SystemExit: not an Exception): the loader would make it a sample error, or skip it.
void note_interrupt(const py::error_already_set& e);

/// Calls `f` (GIL held), its Python exceptions rethrown by rethrow_python.
template <class F>
decltype(auto) call_python(F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (py::error_already_set& e) {
    note_interrupt(e);
    rethrow_python(e);
  }
}

/// What Python's DataLoader shim hands the native loader: torch.utils.data.DataLoader's
/// arguments, already checked and resolved by the shim (samplers into `batches`).
struct Options {
  /// True: index lists come from Python, an iterator of them given to each start_epoch (pulled
  /// with the GIL on the loader's driver). False: `batch_size`/`drop_last` over the dataset in
  /// order, natively.
  bool batches = false;
  std::optional<std::int64_t> batches_len;
  std::int64_t batch_size = 1;
  bool drop_last = false;
  int num_workers = 0;
  bool auto_workers = false;
  /// A Python collate_fn (None: the dataset's own collate; for Python datasets the shim always
  /// passes one).
  PyRef collate;
  bool pin_memory = false;
  double timeout = 0;
  PyRef worker_init_fn;
  std::optional<int> prefetch_factor;
  bool persistent_workers = false;
  bool in_order = true;
  std::uint64_t seed = 0;
  std::string on_error = "raise";
  std::string executor = "threads";
};

/// One DataLoader, whatever its dataset: what the Python DataLoader drives.
class Loader {
 public:
  virtual ~Loader() = default;
  /// len(loader).
  virtual std::int64_t size() const = 0;
  /// Starts an epoch (ending one left unfinished). `indices`: the epoch's iterator of index
  /// lists (None unless Options::batches). `base_seed`: the workers' seeds' base, as torch's
  /// iterator draws it (None: the loader draws its own).
  virtual void start_epoch(py::object indices, std::optional<std::uint64_t> base_seed) = 0;
  /// The next batch as a Python object, or None at the epoch's end. Called with the GIL, which
  /// it releases while it waits; KeyboardInterrupt (any signal handler's error) stops the epoch.
  virtual py::object next() = 0;
  /// Stops the epoch in progress, if any (a `break` out of the loop), and waits until the
  /// last stopped epoch has let go of its index iterator.
  virtual void stop_epoch() = 0;
  virtual std::string state() const = 0;
  virtual void load_state(const std::string& text) = 0;
  /// The epoch state() is in (mid-epoch) or at the start of (between epochs).
  virtual std::int64_t state_epoch() const = 0;
  /// Makes the next epoch `epoch`, from its start, with no epoch in progress (one made again
  /// for other options goes on with the epoch numbers its samples' random streams follow).
  virtual void begin_at_epoch(std::int64_t epoch) = 0;
  virtual std::string metrics_json(bool total) const = 0;
  virtual std::string verdict() const = 0;
  virtual std::int64_t skipped() const = 0;
  virtual int workers() const = 0;
  /// Stops the epoch and joins the workers now; the loader cannot be used after (RuntimeError).
  /// The package closes every loader at exit, before the interpreter finalizes: a worker thread
  /// that asks for the GIL after that is ended by Python mid-call.
  virtual void close() = 0;
};

/// A loader over a Python dataset (map-style or iterable), a coload.TensorDataset, an image
/// folder pipeline or a shard dataset: whichever `dataset` is.
std::unique_ptr<Loader> make_loader(py::object dataset, Options options);

/// Makes coload fork its worker processes as os.fork() does (the GIL taken, Python's fork
/// hooks run), so that a worker process can run a Python dataset.
void install_fork();

/// The Python exception for the C++ exception in flight (raised with PyErr_SetString or, for a
/// WorkerError over a Python exception, with that exception as its __cause__).
void translate_exception(std::exception_ptr error);

/// Registers coload's exception classes with `m` (coload._C.SampleError etc.).
void register_errors(py::module_& m);
/// Registers the native dataset classes (TensorDataset, ImageFolder, ShardDataset).
void register_datasets(py::module_& m);
/// Registers coload._C.Recipe, a vision::Recipe of coload.vision.transforms' ops (recipe.cpp).
void register_recipe(py::module_& m);

}  // namespace coload::python
