// The decoder layer's plan and calls (decoder_layer.cpp), for the module file that binds them (skinny_linear.cpp):
// the plan's fields are read by pybind11, so its definition lives here rather than in the .cpp.
#pragma once
#include "tensor.h"

#include <cstdint>
#include <tuple>
#include <vector>

at::Tensor skinny_linear(at::Tensor x, at::Tensor wb, c10::optional<at::Tensor> bias, int64_t out,
                         c10::optional<at::Tensor> scale);  // skinny_linear.cpp
at::Tensor few_query_attention(at::Tensor query, at::Tensor key, at::Tensor value, c10::optional<at::Tensor> mask,
                               double scale);  // few_query_attention.cpp

namespace hfs_layer {

enum Activation : int64_t { SILU = 0, GELU_TANH = 1 };

// One nn.Linear as the kernel reads it (kernel.py: BlockedWeight / Int8Weight).
struct Linear {
  at::Tensor blocked, bias, scale;  // bias / scale undefined when absent
  int64_t out = 0;

  at::Tensor operator()(const at::Tensor& x) const {  // x [M, in] -> [M, out]
    return skinny_linear(x, blocked, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, out,
                         scale.defined() ? c10::optional<at::Tensor>(scale) : c10::nullopt);
  }
};

// An RMSNorm's weight, and whether it multiplies by (1 + w) (Gemma) or by w (Llama, Qwen).
struct Norm {
  at::Tensor weight;  // [n] float32, undefined: no such norm in this layer
  bool offset = false;
  bool present() const { return weight.defined(); }
};

struct LayerPlan {
  Linear q, k, v, o, gate, up, down;
  Norm input, q_norm, k_norm, post_attention, pre_mlp, post_mlp;
  double eps = 1e-6, attention_scale = 1.0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0, hidden = 0, activation = SILU;
};

using Opt = c10::optional<at::Tensor>;

LayerPlan make_plan(std::vector<std::tuple<at::Tensor, Opt, Opt, int64_t>> linears, std::vector<Opt> norms,
                    bool norm_offset, double eps, double attention_scale, int64_t heads, int64_t kv_heads,
                    int64_t head_dim, int64_t hidden, int64_t activation);
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_inputs(const LayerPlan& plan, at::Tensor x, at::Tensor cos,
                                                                at::Tensor sin);
at::Tensor layer_output(const LayerPlan& plan, at::Tensor x, Opt q, Opt keys, Opt values, Opt mask, Opt attended);

}  // namespace hfs_layer
