// Op conformance cases, matrix-product family: Einsum over the equation forms models use and the
// ones the parser must get right (tests/conformance/einsum_ort_test.py checks the CPU kernel on
// the same forms against ONNX Runtime): matrix products and the attention forms, implicit
// outputs, transposes, diagonals and traces, sums, inner and outer products, three operands,
// '...' with broadcasting, upper-case labels, and the matrix-product forms cuda.einsum.cublaslt
// takes (operand and output transposes, grouped labels). Each case runs on every backend built
// here, every tactic, in f32, f16 and bf16, against the CPU backend (see op_cases.h); every
// backend must run them (`must`).
#include "op_cases.h"

namespace kiln::testing {

std::vector<OpCase> MatmulCases() {
  std::vector<OpCase> c;
  auto must = [&c](std::string name, std::function<OpTester()> make) {
    c.push_back({std::move(name), std::move(make), true});
  };

  // ---- Einsum -----------------------------------------------------------------------------------
  struct Eq {
    const char* name;
    const char* equation;
    std::vector<std::vector<int64_t>> shapes;
  };
  for (const Eq& e : std::vector<Eq>{
           {"matmul", "ij,jk->ik", {{3, 4}, {4, 5}}},
           {"batched_matmul", "bij,bjk->bik", {{2, 3, 4}, {2, 4, 6}}},
           {"attention_scores", "bhid,bhjd->bhij", {{2, 3, 5, 4}, {2, 3, 7, 4}}},
           {"attention_values", "bhij,bhjd->bhid", {{2, 3, 5, 7}, {2, 3, 7, 8}}},
           {"heads_last", "bihd,bjhd->bhij", {{2, 5, 3, 4}, {2, 6, 3, 4}}},
           {"scores_transposed_out", "bhid,bhjd->bhji", {{2, 3, 5, 4}, {2, 3, 7, 4}}},
           {"both_transposed", "ki,kj->ji", {{6, 3}, {6, 4}}},
           {"grouped_rows", "bxyk,bkn->bxyn", {{2, 3, 2, 5}, {2, 5, 4}}},
           {"vector_matrix", "bk,bkn->bn", {{3, 5}, {3, 5, 4}}},
           {"implicit_matmul", "ij,jk", {{3, 4}, {4, 2}}},
           {"transpose", "ijk->kji", {{2, 3, 4}}},
           {"implicit_transpose", "ba", {{3, 5}}},
           {"diagonal", "ii->i", {{5, 5}}},
           {"batch_diagonal", "...ii->...i", {{2, 3, 4, 4}}},
           {"trace", "ii", {{6, 6}}},
           {"repeated_across_operands", "iij,jk->ik", {{3, 3, 4}, {4, 2}}},
           {"sum_all", "ij->", {{4, 7}}},
           {"sum_axis", "ijk->ik", {{3, 4, 5}}},
           {"inner_product", "i,i", {{9}, {9}}},
           {"outer_product", "i,j->ij", {{3}, {4}}},
           {"three_operands", "ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 5}}},
           {"four_operands", "ab,bc,cd,de->ae", {{2, 3}, {3, 2}, {2, 4}, {4, 3}}},
           {"ellipsis_broadcast", "...ij,...jk->...ik", {{2, 1, 3, 4}, {1, 5, 4, 2}}},
           {"ellipsis_middle", "b...d,d->b...", {{2, 3, 4, 6}, {6}}},
           {"ellipsis_implicit", "...j,j", {{2, 3, 5}, {5}}},
           {"ellipsis_ranks_differ", "...ij,jk->...ik", {{4, 2, 3}, {3, 5}}},
           {"upper_case", "Ab,bC->AC", {{2, 3}, {3, 4}}},
           {"bilinear", "bn,anm,bm->ba", {{2, 3}, {4, 3, 5}, {2, 5}}},
           {"scalar_operand", ",ij->ij", {{}, {3, 4}}},
           {"long_reduction", "ik,jk->ij", {{3, 300}, {4, 300}}},
       }) {
    must(std::string("Einsum_") + e.name, [e] {
      OpTester t("Einsum", Attrs({{"equation", std::string(e.equation)}}));
      for (const auto& s : e.shapes) t.Input(kF32, s, -1.0, 1.0);
      // FP32 accumulation against the CPU's double.
      t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
      return t;
    });
  }
  return c;
}

}  // namespace kiln::testing
