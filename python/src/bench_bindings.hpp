// The benchmark engine (timing, statistics, reports) and the operators' descriptions (shapes,
// bytes, FLOPs, dtypes and tolerances of every op), as the `tessera` command uses them. Included
// once, by ext.cpp.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "ops/registry.hpp"
#include "tensors.hpp"

namespace tessera::python {
namespace {

// ---- benchmark engine ---------------------------------------------------------------------
nb::dict stats_to_dict(const bench::Stats& s) {
  nb::dict d;
  d["median_ms"] = s.median_ms;
  d["p20_ms"] = s.p20_ms;
  d["p80_ms"] = s.p80_ms;
  d["min_ms"] = s.min_ms;
  d["max_ms"] = s.max_ms;
  d["mean_ms"] = s.mean_ms;
  d["reps"] = s.reps;
  return d;
}

bench::Stats stats_from_dict(nb::handle h) {
  nb::dict d = nb::cast<nb::dict>(h);
  bench::Stats s;
  s.median_ms = nb::cast<double>(d["median_ms"]);
  auto get = [&](const char* key, double fallback) {
    return d.contains(key) ? nb::cast<double>(d[key]) : fallback;
  };
  s.p20_ms = get("p20_ms", s.median_ms);
  s.p80_ms = get("p80_ms", s.median_ms);
  s.min_ms = get("min_ms", s.median_ms);
  s.max_ms = get("max_ms", s.median_ms);
  s.mean_ms = get("mean_ms", s.median_ms);
  s.reps = d.contains("reps") ? nb::cast<int>(d["reps"]) : 0;
  return s;
}

nb::dict peaks_to_dict(const bench::Peaks& p) {
  nb::dict d;
  d["gpu"] = p.gpu;
  d["device"] = p.device;
  d["sm_count"] = p.sm_count;
  d["l2_mb"] = p.l2_mb;
  d["memory_gb"] = p.memory_gb;
  d["driver_version"] = p.driver_version;
  d["runtime_version"] = p.runtime_version;
  d["copy_gbps"] = p.copy_gbps;
  d["bf16_tflops"] = p.bf16_tflops;
  return d;
}

bench::Peaks peaks_from_dict(nb::handle h) {
  nb::dict d = nb::cast<nb::dict>(h);
  bench::Peaks p;
  auto num = [&](const char* key, double fallback) {
    return d.contains(key) ? nb::cast<double>(d[key]) : fallback;
  };
  if (d.contains("gpu")) p.gpu = nb::cast<std::string>(d["gpu"]);
  p.device = static_cast<int>(num("device", 0));
  p.sm_count = static_cast<int>(num("sm_count", 0));
  p.l2_mb = num("l2_mb", 0);
  p.memory_gb = num("memory_gb", 0);
  p.driver_version = static_cast<int>(num("driver_version", 0));
  p.runtime_version = static_cast<int>(num("runtime_version", 0));
  p.copy_gbps = num("copy_gbps", 0);
  p.bf16_tflops = num("bf16_tflops", 0);
  return p;
}

nb::dict row_to_dict(const bench::Row& r) {
  nb::dict d;
  d["op"] = r.op;
  d["provider"] = r.provider;
  d["dtype"] = r.dtype;
  d["shape"] = r.shape;
  d["size"] = r.size;
  d["bytes"] = r.bytes;
  d["flops"] = r.flops;
  d["stats"] = stats_to_dict(r.stats);
  d["gbps"] = bench::gbps(r);
  d["tflops"] = bench::tflops(r);
  return d;
}

nb::dict time_op(nb::callable fn, uintptr_t stream, double warmup_ms, int min_reps, int max_reps,
                 double budget_ms, bool flush_l2, bool cuda_graph, int graph_batch,
                 bool pass_stream) {
  bench::TimingOptions o;
  o.warmup_ms = warmup_ms;
  o.min_reps = min_reps;
  o.max_reps = max_reps;
  o.budget_ms = budget_ms;
  o.flush_l2 = flush_l2;
  o.cuda_graph = cuda_graph;
  o.graph_batch = graph_batch;
  // The GIL stays held: every rep calls back into Python. A Python exception unwinds through
  // time_op as nb::python_error and reaches the caller unchanged.
  const auto op = [&](cudaStream_t s) {
    if (pass_stream) fn(reinterpret_cast<uintptr_t>(s));
    else fn();
  };
  return stats_to_dict(bench::time_op(op, as_stream(stream), o));
}

// ---- operator descriptions --------------------------------------------------------------------
std::string dtype_names(const std::vector<DType>& dtypes) {
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : ", ") + std::string(dtype_name(d));
  return s;
}

// `dtype` (a name) as one of op's dtypes; `method` names the caller in the message.
DType op_dtype(const ops::OpInfo& op, const char* method, const std::string& dtype) {
  const DType d = dtype_from_name(method, "dtype", dtype);
  if (std::find(op.dtypes.begin(), op.dtypes.end(), d) == op.dtypes.end())
    fail(ErrorKind::value, method, "dtype",
         "a dtype of " + op.name + " (" + dtype_names(op.dtypes) + ")", "'" + dtype + "'");
  return d;
}

ops::BenchShape op_bench_shape(const ops::OpInfo& op, const std::string& dtype, int64_t size) {
  constexpr const char* kMethod = "bench.OpInfo.bench_shape";
  const DType d = op_dtype(op, kMethod, dtype);
  if (size <= 0)
    fail(ErrorKind::value, kMethod, "size", "a positive size (" + op.size_meaning + ")",
         std::to_string(size));
  if (!op.bench_shape)
    fail(ErrorKind::runtime, kMethod, "self", "an op with a bench description", op.name + " has none");
  return op.bench_shape(d, size);
}

double op_tolerance(const ops::OpInfo& op, const std::string& dtype, int64_t k) {
  constexpr const char* kMethod = "bench.OpInfo.tolerance";
  const DType d = op_dtype(op, kMethod, dtype);
  if (!op.tolerance)
    fail(ErrorKind::runtime, kMethod, "self", "an op with a tolerance", op.name + " has none");
  if (k < 1) fail(ErrorKind::value, kMethod, "k", "a sum of at least 1 term", std::to_string(k));
  ops::ErrorModel m;
  m.k = k;
  return op.tolerance(d, m);
}

nb::list op_list(const std::vector<const ops::OpInfo*>& selected) {
  nb::list l;
  for (const ops::OpInfo* op : selected) l.append(nb::cast(op, nb::rv_policy::reference));
  return l;
}

void bind_op_descriptions(nb::module_& m) {
  nb::class_<ops::BenchShape>(m, "BenchShape",
                              "One bench case of an op, as its description gives it: the input "
                              "tensors' shapes (main tensor first, in the op's argument order), "
                              "the report's shape label, the bytes the op must move through HBM "
                              "and the FLOPs it must do.")
      .def_ro("shapes", &ops::BenchShape::shapes)
      .def_ro("shape", &ops::BenchShape::shape)
      .def_ro("bytes", &ops::BenchShape::bytes)
      .def_ro("flops", &ops::BenchShape::flops)
      .def("__repr__", [](const ops::BenchShape& s) {
        char numbers[64];
        std::snprintf(numbers, sizeof numbers, "bytes=%.6g, flops=%.6g", s.bytes, s.flops);
        return "BenchShape(shape=" + s.shape + ", " + numbers + ")";
      });

  // The descriptions live as long as the library: Python holds references, never copies.
  nb::class_<ops::OpInfo>(m, "OpInfo",
                          "The description of one operator: what `tessera verify/bench/profile` "
                          "and the Python benchmarks read.")
      .def_ro("name", &ops::OpInfo::name)
      .def_ro("family", &ops::OpInfo::family)
      .def_ro("summary", &ops::OpInfo::summary)
      .def_prop_ro("dtypes",
                   [](const ops::OpInfo& op) {
                     std::vector<std::string> names;
                     for (DType d : op.dtypes) names.emplace_back(dtype_name(d));
                     return names;
                   },
                   "Supported dtypes, by name.")
      .def_ro("bench_sizes", &ops::OpInfo::bench_sizes, "Default sizes of `tessera bench`.")
      .def_ro("size_meaning", &ops::OpInfo::size_meaning,
              "What a size is for this op: 'elements', or a row length, ...")
      .def("bench_shape", &op_bench_shape, "dtype"_a, "size"_a,
           "The bench case of (dtype name, size): shapes, shape label, bytes, FLOPs.")
      .def("tolerance", &op_tolerance, "dtype"_a, "k"_a = 1,
           "The bound on ||out - ref|| / ||ref|| (against a float64 reference) that verify "
           "accepts for outputs of this dtype behind float32 sums of k terms (DESIGN.md's error "
           "model: c * (u(dtype) + 2^-24 sqrt(k)), c = 4).")
      .def("__repr__", [](const ops::OpInfo& op) {
        return "OpInfo(" + op.name + ", " + op.family + ": " + op.summary + ")";
      });

  m.def("ops", [] {
          std::vector<const ops::OpInfo*> all;
          for (const ops::OpInfo& op : ops::all_ops()) all.push_back(&op);
          return op_list(all);
        },
        "Every operator's description, in the order of `tessera verify`.");
  m.def("select_ops", [](const std::string& name) { return op_list(ops::select_ops(name)); },
        "name"_a,
        "The ops `name` selects on the `tessera` command line: the op and its variants (every op "
        "named `name` or starting with `name` + '_'); empty when none.");
}

void bind_bench(nb::module_& m) {
  // ---- benchmark engine ----
  m.def("time_op", &time_op, "fn"_a, "stream"_a, "warmup_ms"_a, "min_reps"_a, "max_reps"_a,
        "budget_ms"_a, "flush_l2"_a, "cuda_graph"_a, "graph_batch"_a, "pass_stream"_a = false,
        "Times fn (called with no argument, or with the stream handle when pass_stream) with CUDA "
        "events on `stream`; returns the stats as a dict.");
  m.def("measure_peaks",
        [](uintptr_t stream) {
          bench::Peaks p;
          {
            nb::gil_scoped_release release;
            p = bench::measure_peaks(as_stream(stream));
          }
          return peaks_to_dict(p);
        },
        "stream"_a = 0, "Device-to-device copy GB/s and cuBLAS bf16 GEMM TFLOP/s on this GPU.");
  m.def("summarize", [](std::vector<double> samples) { return stats_to_dict(bench::summarize(std::move(samples))); },
        "samples_ms"_a, "Median, p20, p80, min, max, mean of raw times (ms).");
  m.def("quantile", &bench::quantile, "sorted"_a, "q"_a,
        "Quantile q of ascending samples, linear interpolation (numpy's default).");

  nb::class_<bench::Report>(m, "Report", "Benchmark rows, measured ceilings and their writers.")
      .def(nb::init<>())
      .def("add",
           [](bench::Report& r, const std::string& op, const std::string& provider,
              const std::string& dtype, const std::string& shape, int64_t size, double bytes,
              double flops, nb::handle stats) {
             bench::Row row;
             row.op = op;
             row.provider = provider;
             row.dtype = dtype;
             row.shape = shape;
             row.size = size;
             row.bytes = bytes;
             row.flops = flops;
             row.stats = stats_from_dict(stats);
             r.add(row);
           },
           "op"_a, "provider"_a, "dtype"_a, "shape"_a, "size"_a, "bytes"_a, "flops"_a, "stats"_a)
      .def("set_peaks", [](bench::Report& r, nb::handle d) { r.set_peaks(peaks_from_dict(d)); },
           "peaks"_a)
      .def("peaks", [](const bench::Report& r) -> nb::object {
        return r.has_peaks() ? nb::object(peaks_to_dict(r.peaks())) : nb::none();
      })
      .def("rows", [](const bench::Report& r) {
        nb::list l;
        for (const bench::Row& row : r.rows()) l.append(row_to_dict(row));
        return l;
      })
      .def("table", &bench::Report::table)
      .def("write_csv", &bench::Report::write_csv, "path"_a)
      .def("write_json", &bench::Report::write_json, "path"_a)
      .def("write_svgs", &bench::Report::write_svgs, "dir"_a)
      .def("svg", &bench::Report::svg, "op"_a, "dtype"_a);
  bind_op_descriptions(m);
}

}  // namespace
}  // namespace tessera::python
