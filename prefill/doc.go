// Package prefill is the bundled prefill engine: a small Llama-style decoder
// (RMSNorm, RoPE, grouped-query attention, SwiGLU) in float32 that asks the
// store for the longest cached prefix of a prompt, loads those blocks' K/V,
// computes only the suffix, and publishes the new blocks. The CPU backend uses
// gonum's BLAS; a CUDA backend may follow behind the cuda build tag.
package prefill
