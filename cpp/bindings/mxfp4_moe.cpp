// Bindings of family B (MXFP4 x MXFP8 SiTU routed MoE). Python (cake_moe.mxfp4_moe) validates
// shapes, dtypes, devices and overlaps; the plan object owns the kernel parameters.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <optional>

#include "bindings/common.hpp"
#include "host/mxfp4_moe/mxfp4_moe.hpp"
#include "moe/params.hpp"

namespace cake_moe::bindings {

void bind_mxfp4_moe(nb::module_& m) {
  using mxfp4_moe::Plan;
  nb::class_<Plan>(m, "Mxfp4MoePlan")
      .def("run", [](const Plan& self, std::uintptr_t stream) { self.run(stream); }, nb::arg("stream"))
      .def_prop_ro("forms", [](const Plan& self) { return self.forms(); })
      .def_prop_ro("split_width", [](const Plan& self) { return self.split_width(); });

  m.def("mxfp4_moe_workspace_bytes", &mxfp4_moe::workspace_bytes, nb::arg("num_tokens"), nb::arg("hidden"),
        nb::arg("inter"), nb::arg("num_local"), nb::arg("top_k"));
  // Every segment's byte offset (and the total), for the test that holds Python's mirror of the
  // layout (cake_moe.mxfp4_moe._wrapper._workspace_offsets) to it on machines without a GPU.
  m.def(
      "mxfp4_moe_workspace_layout",
      [](int64_t tokens, int64_t hidden, int64_t inter, int64_t num_local, int64_t top_k) {
        const moe::WorkspaceLayout w = moe::workspace_layout(tokens, hidden, inter, num_local, top_k);
        nb::dict d;
        d["offsets"] = w.offsets;
        d["row_token"] = w.row_token;
        d["route_row"] = w.route_row;
        d["tiles"] = w.tiles;
        d["tile_done"] = w.tile_done;
        d["route_chunks"] = w.route_chunks;
        d["split_park"] = w.split_park;
        d["x_bf16"] = w.x_bf16;
        d["act"] = w.act;
        d["rows"] = w.rows;
        d["alt_tiles"] = w.alt_tiles;
        d["total"] = w.total;
        d["tile_header_ints"] = moe::kTileHeaderInts;  // the tile lists' header, and the int32 in it
        d["tile_choice_at"] = moe::kTileChoiceAt;      // naming the GEMM pair the routing kernel chose
        return d;
      },
      nb::arg("num_tokens"), nb::arg("hidden"), nb::arg("inter"), nb::arg("num_local"), nb::arg("top_k"));

  m.def(
      "mxfp4_moe_plan",
      [](Tensor x, Tensor x_sf, Tensor topk_ids, std::optional<Tensor> topk_weights, int weights_kind, Tensor w1,
         Tensor w1_sf, Tensor w2, Tensor w2_sf, Tensor beta, Tensor linear_beta, Tensor workspace, Tensor output,
         std::optional<Tensor> w1_sf_max, std::optional<Tensor> w2_sf_max, int32_t num_tokens, int32_t hidden,
         int32_t inter, int32_t num_experts, int32_t num_local,
         int32_t local_offset, int32_t top_k, const std::string& gemm1_tile, const std::string& gemm2_tile,
         bool tile_sync, const std::string& gemm1_alt_tile, const std::string& gemm2_alt_tile, int32_t tile_cost,
         int32_t alt_tile_cost) {
        if (weights_kind < 0 || weights_kind > 2) throw ValueError("weights_kind must be 0 (bf16), 1 (f32) or 2 (packed)");
        if (weights_kind != 2 && !topk_weights) throw ValueError("topk_weights is required unless routes are packed");
        mxfp4_moe::Problem p;
        p.device = tensor_device(output, "output");
        const Tensor* named[] = {&x, &x_sf, &topk_ids, &w1, &w1_sf, &w2, &w2_sf, &beta, &linear_beta, &workspace};
        for (const Tensor* t : named) tensor_device(*t, "input", p.device);
        require_aligned(x, "x", 16);
        require_aligned(output, "output", 16);
        require_aligned(workspace, "workspace", 256);
        for (const Tensor* t : {&w1, &w1_sf, &w2, &w2_sf}) require_aligned(*t, "weights", 16);
        p.x = static_cast<const uint8_t*>(x.data());
        p.x_sf = static_cast<const uint8_t*>(x_sf.data());
        p.topk_ids = static_cast<const int32_t*>(topk_ids.data());
        if (topk_weights) {
          tensor_device(*topk_weights, "topk_weights", p.device);
          p.topk_weights = topk_weights->data();
        }
        p.weight_kind = weights_kind;
        p.w1 = static_cast<const uint8_t*>(w1.data());
        p.w1_sf = static_cast<const uint8_t*>(w1_sf.data());
        p.w2 = static_cast<const uint8_t*>(w2.data());
        p.w2_sf = static_cast<const uint8_t*>(w2_sf.data());
        if (w1_sf_max.has_value() != w2_sf_max.has_value())
          throw ValueError("w1_sf_max and w2_sf_max come together (both or neither)");
        if (w1_sf_max) {
          tensor_device(*w1_sf_max, "w1_sf_max", p.device);
          tensor_device(*w2_sf_max, "w2_sf_max", p.device);
          p.w1_sf_max = static_cast<const uint8_t*>(w1_sf_max->data());
          p.w2_sf_max = static_cast<const uint8_t*>(w2_sf_max->data());
        }
        p.beta = static_cast<const float*>(beta.data());
        p.linear_beta = static_cast<const float*>(linear_beta.data());
        p.workspace = static_cast<uint8_t*>(workspace.data());
        p.workspace_bytes = nbytes(workspace);
        p.out = static_cast<uint16_t*>(output.data());
        p.tokens = num_tokens;
        p.hidden = hidden;
        p.inter = inter;
        p.num_experts = num_experts;
        p.num_local = num_local;
        p.local_offset = local_offset;
        p.top_k = top_k;
        p.gemm1_tile = gemm1_tile;
        p.gemm2_tile = gemm2_tile;
        p.tile_sync = tile_sync;
        p.gemm1_alt_tile = gemm1_alt_tile;
        p.gemm2_alt_tile = gemm2_alt_tile;
        p.tile_cost = tile_cost;
        p.alt_tile_cost = alt_tile_cost;
        return mxfp4_moe::make_plan(p);
      },
      nb::arg("x"), nb::arg("x_sf"), nb::arg("topk_ids"), nb::arg("topk_weights").none(), nb::arg("weights_kind"),
      nb::arg("w1"), nb::arg("w1_sf"), nb::arg("w2"), nb::arg("w2_sf"), nb::arg("beta"), nb::arg("linear_beta"),
      nb::arg("workspace"), nb::arg("output"), nb::arg("w1_sf_max").none(), nb::arg("w2_sf_max").none(),
      nb::arg("num_tokens"), nb::arg("hidden"), nb::arg("inter"),
      nb::arg("num_experts"), nb::arg("num_local"), nb::arg("local_offset"), nb::arg("top_k"),
      nb::arg("gemm1_tile"), nb::arg("gemm2_tile"), nb::arg("tile_sync"), nb::arg("gemm1_alt_tile") = "",
      nb::arg("gemm2_alt_tile") = "", nb::arg("tile_cost") = 0, nb::arg("alt_tile_cost") = 0);
}

}  // namespace cake_moe::bindings
