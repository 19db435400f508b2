// coload._C: the extension module. Bindings over coload's public C++ API only; what Python
// users see is shaped by the thin Python package around it (python/coload/).

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "binding.hpp"
#include "coload/core/error.hpp"
#include "coload/core/worker_info.hpp"
#include "coload/dataset/tensor_dataset.hpp"
#include "coload/exec/errors.hpp"
#include "coload/loader/errors.hpp"
#include "coload/shards/dataset.hpp"
#include "coload/vision/decode.hpp"
#include "coload/vision/folder.hpp"
#include "coload/vision/pipeline.hpp"
#include "coload/vision/recipe.hpp"
#include "coload/vision/shard_pipeline.hpp"

namespace coload::python {

PyObject* worker_dataset() noexcept;  // loaders.cpp

namespace {

py::object error_class(const char* name) {
  return py::module_::import("coload._errors").attr(name);
}

/// Raises `cls(message)` with `attrs` set on it and, when given, `cause` as its __cause__.
void raise(py::object cls, const std::string& message, py::dict attrs = {},
           py::object cause = py::none()) {
  py::object error = cls(message);
  for (auto item : attrs) py::setattr(error, item.first, item.second);
  if (!cause.is_none()) {
    PyException_SetCause(error.ptr(), cause.release().ptr());  // steals the reference
  }
  PyErr_SetObject(cls.ptr(), error.ptr());
}

/// The original Python exception behind a WorkerError, with its traceback, or None.
py::object python_cause(const WorkerError& e) {
  if (!e.original()) return py::none();
  try {
    std::rethrow_exception(e.original());
  } catch (py::error_already_set& py_error) {
    py::object value = py_error.value();
    if (py_error.trace() && !py_error.trace().is_none()) {
      PyException_SetTraceback(value.ptr(), py_error.trace().ptr());
    }
    return value;
  } catch (...) {
  }
  return py::none();
}

/// A Python exception of a worker process's dataset, as SampleError: the message as torch's
/// ("Caught KeyError in DataLoader worker 0 (pid 4242) while fetching sample 6 of batch 1.",
/// then "Original Traceback (most recent call last):" and the child's traceback), with
/// `original_type` the Python type's name and `traceback` the text.
void raise_from_worker_process(const WorkerError& e) {
  const std::string& sent = e.original_message();  // type name, newline, traceback text
  const auto newline = sent.find('\n');
  const std::string type = sent.substr(0, newline);
  const std::string text = newline == std::string::npos ? std::string() : sent.substr(newline + 1);
  std::string what = e.what();
  // what() is "Caught coload::python::PythonError in DataLoader worker … batch N: " + sent.
  if (what.size() >= sent.size() && what.compare(what.size() - sent.size(), sent.size(), sent) == 0) {
    what.resize(what.size() - sent.size());
  }
  while (!what.empty() && (what.back() == ' ' || what.back() == ':')) what.pop_back();
  const std::string marker = "coload::python::PythonError";
  if (const auto at = what.find(marker); at != std::string::npos) what.replace(at, marker.size(), type);
  what += ".\n";
  what += text.rfind("Traceback", 0) == 0 ? "Original " + text : text;
  raise(error_class("sample_error_for")(type), what,
        py::dict(py::arg("worker_id") = e.worker_id(), py::arg("pid") = e.pid(),
                 py::arg("batch") = e.batch(), py::arg("index") = e.index(),
                 py::arg("original_type") = type, py::arg("traceback") = text));
}

}  // namespace

void translate_exception(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (py::error_already_set&) {
    throw;  // pybind11 restores it
  } catch (const WorkerError& e) {
    if (e.original_type() == "coload::python::PythonError") {
      raise_from_worker_process(e);
      return;
    }
    py::object cause = python_cause(e);
    raise(error_class("sample_error_for")(cause), e.what(),
          py::dict(py::arg("worker_id") = e.worker_id(), py::arg("pid") = e.pid(),
                   py::arg("batch") = e.batch(), py::arg("index") = e.index(),
                   py::arg("original_type") = e.original_type()),
          cause);
  } catch (const WorkerDied& e) {
    raise(error_class("WorkerDied"), e.what(),
          py::dict(py::arg("worker_id") = e.worker_id(), py::arg("pid") = e.pid(),
                   py::arg("batch") = e.batch(), py::arg("signal") = e.signal(),
                   py::arg("exit_code") = e.exit_code()));
  } catch (const TimeoutError& e) {
    raise(error_class("TimeoutError"), e.what(),
          py::dict(py::arg("worker_id") = e.worker_id(), py::arg("pid") = e.pid(),
                   py::arg("batch") = e.batch(), py::arg("seconds") = e.seconds()));
  } catch (const vision::FolderError& e) {
    raise(py::reinterpret_borrow<py::object>(PyExc_FileNotFoundError), e.what());
  } catch (const LoaderError& e) {
    raise(error_class("LoaderError"), e.what());
  } catch (const std::invalid_argument& e) {
    raise(py::reinterpret_borrow<py::object>(PyExc_ValueError), e.what());
  } catch (const std::out_of_range& e) {
    raise(py::reinterpret_borrow<py::object>(PyExc_IndexError), e.what());
  } catch (const std::system_error& e) {
    raise(py::reinterpret_borrow<py::object>(PyExc_OSError), e.what());
  }
  // Anything else: pybind11's own translation (RuntimeError with what()).
}

void register_errors(py::module_& m) {
  (void)m;
  py::register_exception_translator([](std::exception_ptr p) { translate_exception(p); });
}

namespace {
// ShardDataset::cache_wait from Python: the GIL let go in slices of 100 ms, between which a
// signal's handler runs (Ctrl-C ends the wait with KeyboardInterrupt). `timeout` in seconds,
// None (or an infinite one) for no bound; whether the fetches were done with.
bool wait_for_cache(const shards::ShardDataset& d, std::optional<double> timeout) {
  using namespace std::chrono;
  if (timeout && !(*timeout >= 0)) {
    throw py::value_error("cache_wait: timeout should be None or a number of seconds >= 0, got " +
                          std::to_string(*timeout));
  }
  // Over a year is no bound (and a duration of that many milliseconds could overflow).
  if (timeout && *timeout > 365.0 * 86400) timeout.reset();
  const auto until =
      steady_clock::now() + ceil<milliseconds>(duration<double>(timeout.value_or(0)));
  for (;;) {
    milliseconds slice(100);
    if (timeout) {
      slice = std::clamp(ceil<milliseconds>(until - steady_clock::now()), 0ms, slice);
    }
    bool done = false;
    {
      py::gil_scoped_release nogil;
      done = d.cache_wait_for(slice);
    }
    if (done) return true;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (timeout && steady_clock::now() >= until) return false;
  }
}
}  // namespace

void register_datasets(py::module_& m) {
  py::class_<TensorDataset>(m, "TensorDataset")
      .def(py::init([](const std::vector<at::Tensor>& tensors) { return TensorDataset(tensors); }))
      .def("__len__", &TensorDataset::size)
      .def("__getitem__", [](const TensorDataset& d, Index i) { return d.get(i); })
      .def_property_readonly("tensors", &TensorDataset::tensors);

  py::class_<vision::ImagePipeline>(m, "ImagePipeline")
      .def(py::init([](const std::string& root, const std::string& recipe, bool train) {
             auto r = train ? vision::presets::train(recipe) : vision::presets::eval(recipe);
             return vision::ImagePipeline(root, vision::FusedTransform(std::move(r)));
           }),
           py::arg("root"), py::arg("recipe"), py::arg("train"))
      // A composed recipe (coload.vision.Recipe's): `train` is the recipe's own business.
      .def(py::init([](const std::string& root, const vision::Recipe& recipe, bool /*train*/) {
             return vision::ImagePipeline(root, vision::FusedTransform(recipe));
           }),
           py::arg("root"), py::arg("recipe"), py::arg("train"))
      .def("__len__", &vision::ImagePipeline::size)
      .def_property_readonly("classes",
                             [](const vision::ImagePipeline& p) { return p.index().classes; })
      .def_property_readonly("class_to_idx",
                             [](const vision::ImagePipeline& p) { return p.index().class_to_idx; })
      .def_property_readonly("targets",
                             [](const vision::ImagePipeline& p) { return p.index().targets; })
      .def_property_readonly("samples", [](const vision::ImagePipeline& p) {
        py::list out;
        for (const auto& s : p.index().samples) out.append(py::make_tuple(s.path, s.class_index));
        return out;
      });
  m.def("recipe_presets", [] { return vision::presets::names(); });
  // JPEG checkpoints (coload/vision/decode.hpp); coload.vision checks the budget's type and sign.
  m.def("jpeg_checkpoint_budget", [] { return vision::jpeg_checkpoint_budget(); });
  m.def("set_jpeg_checkpoint_budget",
        [](std::size_t bytes) { return vision::set_jpeg_checkpoint_budget(bytes); });
  m.def("jpeg_checkpoint_bytes", [] { return vision::jpeg_checkpoint_bytes(); });

  // A file beside tar shards (classes.txt), by path or URL, as bytes: None when it is not
  // there. The GIL is let go while it is fetched.
  m.def(
      "read_beside_shards",
      [](const std::string& root, const std::string& name) -> py::object {
        std::optional<std::string> text;
        {
          py::gil_scoped_release release;
          text = shards::read_beside_shards(root, name);
        }
        if (!text) return py::none();
        return py::bytes(*text);  // its encoding is the caller's to choose
      },
      py::arg("root"), py::arg("name"));

  // Tar shards' images through the same fused transforms (a preset's or a composed recipe),
  // labels from each sample's `cls`; `num_classes` for a MixUp/CutMix with none of its own.
  // The cache of shards by URL (ShardOptions::cache_dir, cache_bytes): off by default. The
  // constructors fetch indices by URL: the GIL is let go meanwhile.
  const auto options = [](const std::string& cache_dir, std::uint64_t cache_bytes) {
    shards::ShardOptions o;
    o.cache_dir = cache_dir;
    o.cache_bytes = cache_bytes;
    return o;
  };
  const auto pipeline = [options](const std::string& path, vision::FusedTransform transform,
                                  int num_classes, const std::string& cache_dir,
                                  std::uint64_t cache_bytes) {
    return vision::ShardImagePipeline(shards::ShardDataset(path, options(cache_dir, cache_bytes)),
                                      std::move(transform), {}, num_classes);
  };
  py::class_<vision::ShardImagePipeline>(m, "ShardImagePipeline")
      .def(py::init([pipeline](const std::string& path, const std::string& recipe, bool train,
                               int num_classes, const std::string& cache_dir,
                               std::uint64_t cache_bytes) {
             auto r = train ? vision::presets::train(recipe) : vision::presets::eval(recipe);
             return pipeline(path, vision::FusedTransform(std::move(r)), num_classes, cache_dir,
                             cache_bytes);
           }),
           py::arg("path"), py::arg("recipe"), py::arg("train"), py::arg("num_classes"),
           py::arg("cache_dir") = "", py::arg("cache_bytes") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def(py::init([pipeline](const std::string& path, const vision::Recipe& recipe,
                               bool /*train*/, int num_classes, const std::string& cache_dir,
                               std::uint64_t cache_bytes) {
             return pipeline(path, vision::FusedTransform(recipe), num_classes, cache_dir,
                             cache_bytes);
           }),
           py::arg("path"), py::arg("recipe"), py::arg("train"), py::arg("num_classes"),
           py::arg("cache_dir") = "", py::arg("cache_bytes") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def("__len__", &vision::ShardImagePipeline::size)
      .def(
          "cache_wait",
          [](const vision::ShardImagePipeline& p, std::optional<double> timeout) {
            return wait_for_cache(p.shards(), timeout);
          },
          py::arg("timeout") = py::none())
      .def("cache_fill", [](const vision::ShardImagePipeline& p) { p.shards().cache_fill(); });

  py::class_<shards::ShardDataset>(m, "ShardDataset")
      .def(py::init([options](const std::string& path, const std::string& cache_dir,
                              std::uint64_t cache_bytes) {
             return shards::ShardDataset(path, options(cache_dir, cache_bytes));
           }),
           py::arg("path"), py::arg("cache_dir") = "", py::arg("cache_bytes") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def(py::init([options](const std::vector<std::string>& names,
                              const std::string& cache_dir, std::uint64_t cache_bytes) {
             return shards::ShardDataset(names, options(cache_dir, cache_bytes));
           }),
           py::arg("shards"), py::arg("cache_dir") = "", py::arg("cache_bytes") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def("__len__", &shards::ShardDataset::size)
      .def("cache_wait", &wait_for_cache, py::arg("timeout") = py::none())
      .def("cache_fill", &shards::ShardDataset::cache_fill);
}

}  // namespace coload::python

PYBIND11_MODULE(_C, m) {
  using namespace coload::python;
  m.doc() = "coload's native loader (use the coload package, not this module)";
  register_errors(m);
  register_recipe(m);  // before the datasets, whose ImagePipeline takes one
  register_datasets(m);
  install_fork();

  py::class_<Options> options(m, "Options");
  for (auto [name, member] : {std::pair{"collate", &Options::collate},
                              std::pair{"worker_init_fn", &Options::worker_init_fn}}) {
    // A Python object (None: unset), held as a PyRef that worker threads may drop.
    options.def_property(
        name, [member](const Options& o) { return o.*member ? (o.*member).get() : py::none(); },
        [member](Options& o, py::object f) { o.*member = f.is_none() ? PyRef() : PyRef(f); });
  }
  options.def(py::init<>())
      .def_readwrite("batches", &Options::batches)
      .def_readwrite("batches_len", &Options::batches_len)
      .def_readwrite("batch_size", &Options::batch_size)
      .def_readwrite("drop_last", &Options::drop_last)
      .def_readwrite("num_workers", &Options::num_workers)
      .def_readwrite("auto_workers", &Options::auto_workers)
      .def_readwrite("pin_memory", &Options::pin_memory)
      .def_readwrite("timeout", &Options::timeout)
      .def_readwrite("prefetch_factor", &Options::prefetch_factor)
      .def_readwrite("persistent_workers", &Options::persistent_workers)
      .def_readwrite("in_order", &Options::in_order)
      .def_readwrite("seed", &Options::seed)
      .def_readwrite("on_error", &Options::on_error)
      .def_readwrite("executor", &Options::executor);

  py::class_<Loader>(m, "Loader")
      .def(py::init([](py::object dataset, Options options) {
        return make_loader(std::move(dataset), std::move(options));
      }))
      .def("__len__", &Loader::size)
      .def("start_epoch", &Loader::start_epoch, py::arg("indices") = py::none(),
           py::arg("base_seed") = py::none())
      .def("next", &Loader::next)
      .def("stop_epoch", &Loader::stop_epoch)
      .def("state", &Loader::state)
      .def("load_state", &Loader::load_state)
      .def("state_epoch", &Loader::state_epoch)
      .def("begin_at_epoch", &Loader::begin_at_epoch)
      .def("metrics_json", &Loader::metrics_json, py::arg("total") = false)
      .def("verdict", &Loader::verdict)
      .def("skipped", &Loader::skipped)
      .def("workers", &Loader::workers)
      .def("close", &Loader::close);

  // Which worker the calling thread is, for get_worker_info(): (id, num_workers, seed, dataset)
  // or None outside a worker.
  m.def("worker_info", []() -> py::object {
    const std::optional<coload::WorkerInfo> info = coload::get_worker_info();
    if (!info) return py::none();
    PyObject* ds = worker_dataset();
    return py::make_tuple(info->id, info->num_workers, info->seed,
                          ds ? py::reinterpret_borrow<py::object>(ds) : py::none());
  });
}
