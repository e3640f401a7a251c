"""PyTorch's own attention (scaled_dot_product_attention, each backend it has) at the shapes of
cuda_kernels_bench's attention cases, timed with CUDA events: the reference kiln's attention
kernels are compared with on the same GPU (the bench's `attention_<model>_b<B>_t<N>` rows).

    python3 bench/cuda/sdpa_ref.py            # prints one line per shape and backend, in us
"""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [  # name, batch, heads, tokens, mask
    ("bert", 32, 12, 128, "additive"),
    ("gpt2", 32, 12, 128, "causal"),
    ("vit", 32, 12, 197, "none"),
    ("whisper", 8, 8, 1500, "none"),
]
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def time_us(fn, reps=200):
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / reps


def main():
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for name, b, h, s, mask in SHAPES:
        q, k, v = (torch.randn(b, h, s, 64, device="cuda", dtype=torch.float16) for _ in range(3))
        kw = {}
        if mask == "additive":  # BERT's padding mask, [B, 1, 1, S]
            kw["attn_mask"] = torch.zeros(b, 1, 1, s, device="cuda", dtype=torch.float16)
        elif mask == "causal":
            kw["is_causal"] = True
        kw32 = {key: (x.float() if torch.is_tensor(x) else x) for key, x in kw.items()}
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                               **kw32)
        for bname, backend in BACKENDS.items():
            try:
                with sdpa_kernel(backend):
                    run = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
                    out = run()
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    print(f"{name} b{b} h{h} s{s} {mask}: {bname} {time_us(run):.1f} us "
                          f"(rel L2 {err:.1e})")
            except RuntimeError as e:
                print(f"{name} b{b} h{h} s{s} {mask}: {bname} not available ({str(e)[:80]})")


if __name__ == "__main__":
    main()
