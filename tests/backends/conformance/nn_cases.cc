// Op conformance cases, nn family: LayerNormalization, SkipLayerNormalization,
// (Skip)RMSNormalization, RotaryEmbedding, BatchNormalization, GatedActivation,
// Softmax/LogSoftmax and pooling. Each case is a one-node graph that the suite
// (op_conformance_test.cc) runs on every backend built here, every tactic, on fresh random
// inputs, against the CPU backend (see op_cases.h).
#include "op_cases.h"

namespace kiln::testing {

std::vector<OpCase> NnCases() {
  std::vector<OpCase> c;
  // `add`: a case each backend runs where it has a tactic; `must`: every backend must have one.
  [[maybe_unused]] auto add = [&c](std::string name, std::function<OpTester()> make) {
    c.push_back({std::move(name), std::move(make), false});
  };
  [[maybe_unused]] auto must = [&c](std::string name, std::function<OpTester()> make) {
    c.push_back({std::move(name), std::move(make), true});
  };

  // ---- normalisations -------------------------------------------------------------------------
  for (std::vector<int64_t> dims : {std::vector<int64_t>{4, 7, 33}, std::vector<int64_t>{3, 768},
                                    std::vector<int64_t>{2, 1500}, std::vector<int64_t>{1, 1}}) {
    add("LayerNorm_" + std::to_string(dims.back()) + "_" + std::to_string(dims.size()), [dims] {
      OpTester t("LayerNormalization", Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5f}}));
      t.Input(kF32, dims).Input(kF32, {dims.back()}).Input(kF32, {dims.back()});
      t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
      return t;
    });
  }
  // The warp-vec tactic's register path with several warps per row (f16 4096: 4 warps; f32 4096:
  // 8) and the 1024-halves single-warp case.
  for (int64_t n : {1024, 4096}) {
    add("LayerNorm_rows_" + std::to_string(n), [n] {
      OpTester t("LayerNormalization", Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5f}}));
      t.Input(kF32, {5, n}).Input(kF32, {n}).Input(kF32, {n});
      t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
      return t;
    });
  }
  // SkipLayerNormalization (residual Add + LayerNorm): register path (768, 1024, 4096, 8 * 16),
  // general paths (33: not a multiple of 16 bytes; 1500 on f16: a block per row), with and
  // without the sum output.
  for (std::vector<int64_t> dims : {std::vector<int64_t>{4, 7, 33}, std::vector<int64_t>{3, 768},
                                    std::vector<int64_t>{2, 1500}, std::vector<int64_t>{3, 1024},
                                    std::vector<int64_t>{2, 4096}, std::vector<int64_t>{9, 128}}) {
    for (int outputs : {1, 2}) {
      add("SkipLayerNorm_" + std::to_string(dims.back()) + "_out" + std::to_string(outputs),
          [dims, outputs] {
            OpTester t("SkipLayerNormalization",
                       Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5f}}));
            t.Input(kF32, dims).Input(kF32, dims).Input(kF32, {dims.back()}, 0.5, 1.5);
            t.Input(kF32, {dims.back()}).Outputs(outputs);
            t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
            return t;
          });
    }
  }
  // Enough rows (>= 132 * 8 warps) for the one-warp-per-row geometry BERT/GPT-2 batch 32 get; the
  // small cases above spread rows over several warps.
  add("SkipLayerNorm_1200x768_out2", [] {
    OpTester t("SkipLayerNormalization", Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5f}}));
    t.Input(kF32, {1200, 768}).Input(kF32, {1200, 768}).Input(kF32, {768}, 0.5, 1.5);
    t.Input(kF32, {768}).Outputs(2).FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
    return t;
  });
  add("LayerNorm_1200x768", [] {
    OpTester t("LayerNormalization", Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5f}}));
    t.Input(kF32, {1200, 768}).Input(kF32, {768}).Input(kF32, {768});
    t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
    return t;
  });
  add("SkipLayerNorm_axis1_no_bias", [] {
    OpTester t("SkipLayerNormalization", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {2, 3, 8}).Input(kF32, {2, 3, 8}).Input(kF32, {3, 8}).Outputs(2);
    t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
    return t;
  });
  add("LayerNorm_axis1_no_bias", [] {
    OpTester t("LayerNormalization", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {2, 3, 8}).Input(kF32, {3, 8}).FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
    return t;
  });
  add("LayerNorm_stats_outputs", [] {
    OpTester t("LayerNormalization", Attrs({{"axis", int64_t{-1}}}));
    t.Input(kF32, {5, 40}).Input(kF32, {40}).Input(kF32, {40}).Outputs(3).Tolerance(1e-4, 1e-4);
    return t;
  });
  // RMSNormalization: vector loads with a warp per row (768, Llama's hidden sizes), a block per
  // row (4096 on f32, 5120), scalar loads (33, 1500: not a multiple of 16 bytes), many rows.
  for (std::vector<int64_t> dims :
       {std::vector<int64_t>{4, 7, 33}, std::vector<int64_t>{3, 768}, std::vector<int64_t>{2, 1500},
        std::vector<int64_t>{2, 4096}, std::vector<int64_t>{2, 5120},
        std::vector<int64_t>{1200, 768}}) {
    add("RmsNorm_" + std::to_string(dims.front()) + "x" + std::to_string(dims.back()), [dims] {
      OpTester t("RMSNormalization", Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-6f}}));
      t.Input(kF32, dims, -3, 3).Input(kF32, {dims.back()}, 0.5, 1.5);
      t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
      return t;
    });
  }
  add("RmsNorm_axis1", [] {
    OpTester t("RMSNormalization", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {2, 3, 8}).Input(kF32, {3, 8}, 0.5, 1.5).FloatTypes(kAllFloats);
    t.Tolerance(1e-4, 1e-4);
    return t;
  });
  // SkipRMSNormalization (residual Add + RMSNorm): vector loads (768, 4096, Llama's hidden
  // sizes: a warp or a block per row), scalar loads (33), with and without the sum output.
  for (std::vector<int64_t> dims :
       {std::vector<int64_t>{4, 7, 33}, std::vector<int64_t>{3, 768}, std::vector<int64_t>{2, 4096},
        std::vector<int64_t>{2, 1500}, std::vector<int64_t>{1200, 768}}) {
    for (int outputs : {1, 2}) {
      must("SkipRmsNorm_" + std::to_string(dims.front()) + "x" + std::to_string(dims.back()) +
               "_out" + std::to_string(outputs),
           [dims, outputs] {
             OpTester t("SkipRMSNormalization", Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-6f}}));
             t.Input(kF32, dims, -3, 3).Input(kF32, dims, -3, 3);
             t.Input(kF32, {dims.back()}, 0.5, 1.5).Outputs(outputs);
             t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
             return t;
           });
    }
  }
  add("SkipRmsNorm_axis1", [] {
    OpTester t("SkipRMSNormalization", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {2, 3, 8}).Input(kF32, {2, 3, 8}).Input(kF32, {3, 8}, 0.5, 1.5).Outputs(2);
    t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
    return t;
  });
  // RotaryEmbedding: Llama's [B, H, S, D] against [1, 1, S, D] tables (D 64 and 128: 16-byte
  // chunks), tables per batch ([B, 1, S, D], computed from position ids), the [B, S, H, D] layout
  // against [S, 1, D], an odd half (D 6: scalar pairs), tables that broadcast along the row
  // ([S, 1]), and the interleaved (GPT-J) form.
  struct Rope {
    std::string name;
    std::vector<int64_t> x, cos;
    int64_t interleaved;
  };
  for (const Rope& r : std::vector<Rope>{{"llama_d64", {2, 4, 9, 64}, {1, 1, 9, 64}, 0},
                                         {"llama_d128", {2, 3, 5, 128}, {5, 128}, 0},
                                         {"per_batch", {2, 4, 7, 64}, {2, 1, 7, 64}, 0},
                                         {"bshd", {2, 7, 4, 32}, {7, 1, 32}, 0},
                                         {"odd_half", {3, 2, 5, 6}, {5, 6}, 0},
                                         {"row_broadcast", {2, 3, 5, 16}, {5, 1}, 0},
                                         {"interleaved_d64", {2, 4, 9, 64}, {9, 64}, 1},
                                         {"interleaved_d6", {3, 5, 6}, {5, 6}, 1}}) {
    must("Rotary_" + r.name, [r] {
      OpTester t("RotaryEmbedding", Attrs({{"interleaved", r.interleaved}}));
      t.Input(kF32, r.x, -3, 3).Input(kF32, r.cos, -1, 1).Input(kF32, r.cos, -1, 1);
      t.FloatTypes(kAllFloats).Tolerance(1e-5, 1e-5);
      return t;
    });
  }
  // GatedActivation (SwiGLU, GeGLU): two inputs (odd sizes: scalar accesses; 688: 16-byte), and
  // the packed gate/up halves of one input (Llama 7B's 11008 intermediate, an odd 35).
  // swish is x * sigmoid(alpha * x) with CLIP's QuickGELU alpha.
  for (const char* act : {"silu", "swish", "gelu", "gelu_tanh"}) {
    std::string sact = act;
    for (std::vector<int64_t> dims :
         {std::vector<int64_t>{4, 7, 33}, std::vector<int64_t>{64, 688}}) {
      add("Gated_" + sact + "_" + std::to_string(dims.back()), [sact, dims] {
        OpTester t("GatedActivation", Attrs({{"activation", sact}, {"activation_alpha", 1.702f}}));
        t.Input(kF32, dims, -4, 4).Input(kF32, dims).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-5);
        return t;
      });
    }
    for (std::vector<int64_t> dims :
         {std::vector<int64_t>{8, 2 * 11008}, std::vector<int64_t>{5, 70}}) {
      add("Gated_packed_" + sact + "_" + std::to_string(dims.back()), [sact, dims] {
        OpTester t("GatedActivation", Attrs({{"activation", sact}}));
        t.Input(kF32, dims, -4, 4).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-5);
        return t;
      });
    }
  }
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    std::string sop = op;
    for (std::vector<int64_t> dims : {std::vector<int64_t>{3, 37}, std::vector<int64_t>{2, 4, 128},
                                      std::vector<int64_t>{2, 2000}, std::vector<int64_t>{7, 1}}) {
      add(sop + "_last_" + std::to_string(dims.back()), [sop, dims] {
        OpTester t(sop, Attrs({{"axis", int64_t{-1}}}));
        t.Input(kF32, dims, -5, 5).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
        return t;
      });
    }
    add(sop + "_axis1", [sop] {
      OpTester t(sop, Attrs({{"axis", int64_t{1}}}));
      t.Input(kF32, {2, 5, 7}, -5, 5).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
      return t;
    });
  }
  add("BatchNorm", [] {
    OpTester t("BatchNormalization", Attrs({{"epsilon", 1e-3f}}));
    t.Input(kF32, {2, 3, 5, 7}).Input(kF32, {3}).Input(kF32, {3}).Input(kF32, {3});
    t.Input(kF32, {3}, 0.5, 2).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
    return t;
  });

  // ---- pooling ----------------------------------------------------------------------------------
  add("MaxPool_3x3_s2_p1", [] {
    OpTester t("MaxPool", Attrs({{"kernel_shape", std::vector<int64_t>{3, 3}},
                                 {"strides", std::vector<int64_t>{2, 2}},
                                 {"pads", std::vector<int64_t>{1, 1, 1, 1}}}));
    t.Input(kF32, {2, 3, 9, 11}).FloatTypes(kAllFloats);
    return t;
  });
  add("MaxPool_ceil_dilated", [] {
    OpTester t("MaxPool", Attrs({{"kernel_shape", std::vector<int64_t>{2, 3}},
                                 {"strides", std::vector<int64_t>{2, 2}},
                                 {"dilations", std::vector<int64_t>{1, 2}},
                                 {"ceil_mode", int64_t{1}}}));
    t.Input(kF32, {1, 4, 10, 13}).FloatTypes(kAllFloats);
    return t;
  });
  add("AveragePool_pad_include", [] {
    OpTester t("AveragePool", Attrs({{"kernel_shape", std::vector<int64_t>{3, 3}},
                                     {"pads", std::vector<int64_t>{1, 1, 1, 1}},
                                     {"count_include_pad", int64_t{1}}}));
    t.Input(kF32, {2, 2, 6, 7}).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
    return t;
  });
  add("AveragePool_same_upper", [] {
    OpTester t("AveragePool", Attrs({{"kernel_shape", std::vector<int64_t>{2, 2}},
                                     {"strides", std::vector<int64_t>{2, 2}},
                                     {"auto_pad", std::string("SAME_UPPER")}}));
    t.Input(kF32, {1, 3, 7, 9}).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
    return t;
  });
  add("MaxPool_1d", [] {
    OpTester t("MaxPool", Attrs({{"kernel_shape", std::vector<int64_t>{3}}}));
    t.Input(kF32, {2, 3, 10}).FloatTypes(kAllFloats);
    return t;
  });
  for (std::vector<int64_t> dims :
       {std::vector<int64_t>{2, 3, 7, 9}, std::vector<int64_t>{1, 640, 7, 7},
        std::vector<int64_t>{2, 5, 1, 1}}) {
    for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
      std::string sop = op;
      add(sop + "_" + std::to_string(dims[1]) + "x" + std::to_string(dims[2]), [sop, dims] {
        OpTester t(sop);
        t.Input(kF32, dims).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
        return t;
      });
    }
  }

  return c;
}

}  // namespace kiln::testing
