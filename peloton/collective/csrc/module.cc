// pybind11 binding: peloton.collective._core. Buffers travel as raw addresses; the Python layer
// keeps the arrays alive until the handle is synchronized.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "auth.h"
#include "nccl_comm.h"
#include "net.h"
#include "runtime.h"

namespace py = pybind11;
using namespace peloton;

namespace {

// Owns an allgather result; exposes it through the buffer protocol without a copy.
struct Gathered {
  std::vector<char> bytes;
  std::vector<int64_t> dim0s;
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "peloton collective runtime core (TCP ring, negotiation, fusion)";
  static py::exception<CollectiveError> exc(m, "CollectiveError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CollectiveError& e) {
      py::set_error(exc, e.what());
    } catch (const PeerError& e) {
      py::set_error(exc, e.what());
    }
  });

  py::class_<Gathered>(m, "Gathered", py::buffer_protocol())
      .def_readonly("dim0s", &Gathered::dim0s)
      .def_buffer([](Gathered& g) {
        return py::buffer_info(g.bytes.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(g.bytes.size())}, {1});
      });

  m.def("nccl_available", [] {
    std::string why;
    const bool ok = nccl_available(&why);
    return py::make_tuple(ok, why);
  });
  m.def("nccl_unique_id", [] { return py::bytes(nccl_unique_id()); });
  m.def("refused_connections", &refused_connections,
        "Connections this process's runtime refused (no rank of its gang: wrong or no gang secret, garbage, "
        "silence).");
  m.def("end_generation", &end_generation, py::arg("generation"),
        "Ranks still connecting for this generation (or an earlier one) give up at once.");
#ifdef PELOTON_HAVE_NCCL_H
  m.attr("NCCL_HEADERS") = true;
#else
  m.attr("NCCL_HEADERS") = false;
#endif

  py::class_<NcclComm>(m, "NcclComm")
      .def(py::init<const std::string&, int, int, int, double>(), py::arg("unique_id"), py::arg("rank"),
           py::arg("size"), py::arg("device"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>())
      .def(
          "allreduce",
          [](NcclComm& c, const std::string& name, uintptr_t in, uintptr_t out, size_t count, int dt, int op,
             uintptr_t stream) { c.allreduce(name, in, out, count, static_cast<DType>(dt), static_cast<ROp>(op), stream); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "broadcast",
          [](NcclComm& c, const std::string& name, uintptr_t in, uintptr_t out, size_t count, int dt, int root,
             uintptr_t stream) { c.broadcast(name, in, out, count, static_cast<DType>(dt), root, stream); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "allgather",
          [](NcclComm& c, const std::string& name, uintptr_t in, uintptr_t out, size_t count, int dt,
             uintptr_t stream) { c.allgather(name, in, out, count, static_cast<DType>(dt), stream); },
          py::call_guard<py::gil_scoped_release>())
      .def("abort", &NcclComm::abort, py::call_guard<py::gil_scoped_release>());

  py::class_<Runtime>(m, "Runtime")
      .def(py::init<int, int, const std::vector<std::string>&, const std::vector<int>&, double, size_t, int, int,
                    int, int, uint32_t, const std::string&>(),
           py::arg("rank"), py::arg("size"), py::arg("hosts"), py::arg("ports"), py::arg("timeout"),
           py::arg("fusion_threshold"), py::arg("local_rank") = 0, py::arg("local_size") = 1,
           py::arg("cross_rank") = -1, py::arg("cross_size") = -1, py::arg("generation") = 0, py::arg("secret") = "",
           py::call_guard<py::gil_scoped_release>())
      .def(
          "enqueue",
          [](Runtime& rt, int kind, const std::string& name, int dtype, int op, int root,
             const std::vector<int64_t>& shape, uintptr_t in, uintptr_t out, size_t nbytes) {
            Request r;
            r.kind = static_cast<Kind>(kind);
            r.name = name;
            r.dtype = static_cast<DType>(dtype);
            r.op = static_cast<ROp>(op);
            r.root = root;
            r.shape = shape;
            return rt.enqueue(r, reinterpret_cast<const void*>(in), reinterpret_cast<void*>(out), nbytes);
          },
          py::arg("kind"), py::arg("name"), py::arg("dtype"), py::arg("op"), py::arg("root"), py::arg("shape"),
          py::arg("inp"), py::arg("out"), py::arg("nbytes"))
      .def("poll", &Runtime::poll)
      .def(
          "wait",
          [](Runtime& rt, int64_t h) -> py::object {
            std::shared_ptr<Entry> e;
            {
              py::gil_scoped_release nogil;
              e = rt.wait(h);
            }
            if (e->req.kind != Kind::ALLGATHER) return py::none();
            auto g = std::make_unique<Gathered>();
            g->bytes = std::move(e->gathered);
            g->dim0s = e->dim0s;
            return py::cast(std::move(g));
          },
          py::arg("handle"))
      .def("shutdown", &Runtime::shutdown, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("rank", &Runtime::rank)
      .def_property_readonly("size", &Runtime::size);
}
