# atlas device profile (NVIDIA H100 SXM5 80GB, BF16). Format: profiles/README.md
format                    = atlas-profile 1
kind                      = device
name                      = h100
description               = "NVIDIA H100 SXM5 80GB, BF16"
peak_tflops               = 989
peak_tflops_tf32          = 494.5
peak_tflops_fp32          = 67
achievable_fraction       = 0.45
memory_gib                = 80
usable_memory_fraction    = 0.9
mem_bandwidth_gbs         = 3350
nvlink_gbs                = 450
nvlink_latency_us         = 3
nvlink_efficiency         = 0.8
bwd_over_fwd              = 2
activation_bytes          = 2
grad_bytes                = 2
state_bytes_per_param     = 16
optimizer_bytes_per_param = 28
board_power_w             = 700
pipeline_scatter_gather   = true
sequence_parallel         = true
selective_recompute       = true
fused_attention           = true
gemm_min_dim              = 64 128 256 512 1024 2048 4096 8192
gemm_fraction             = 0.15 0.28 0.42 0.55 0.65 0.72 0.76 0.78
source.peak_tflops = "NVIDIA H100 Tensor Core GPU datasheet (2023): SXM BF16 1,979 TFLOPS with sparsity = 989 dense"
source.peak_tflops_tf32 = "NVIDIA H100 datasheet (2023): SXM TF32 989 TFLOPS with sparsity = 494.5 dense, FP32 67 TFLOPS; both only for the MFU of tf32/fp32 runs"
source.memory_gib = "same datasheet: 80 GB HBM3, 3.35 TB/s"
source.nvlink_gbs = "same datasheet: NVLink 900 GB/s total = 450 GB/s per direction"
source.achievable_fraction = "0.45: Narayanan et al., SC'21 (Megatron-LM, arXiv:2104.04473) reach 44-52% of A100 peak for 145B-1T GPT models; Jiang et al., NSDI'24 (MegaScale) report 55.2% MFU for 175B on 12,288 GPUs"
source.state_bytes_per_param = "Rajbhandari et al., SC'20 (ZeRO, arXiv:1910.02054): mixed-precision Adam keeps 2+2+12 = 16 bytes per parameter"
source.bwd_over_fwd = "backward = 2x forward FLOPs (Kaplan et al. 2020, arXiv:2001.08361: ~6N FLOPs per token)"
source.activation_bytes = "bf16 activations; memory per layer from Korthikanti et al., MLSys'23 (arXiv:2205.05198): 34*s*b*h/t bytes with sequence parallelism and selective recomputation (their recommended setting, used by Megatron-LM for large models)"
source.grad_bytes = "bf16 gradient all-reduce (generous to DP over the WAN; Megatron's fp32 default would double it)"
source.pipeline_scatter_gather = "Megatron-LM sends 1/tp of a boundary tensor per TP rank (scatter-gather, Narayanan et al. SC'21)"
source.usable_memory_fraction = "assumption: 10% for CUDA context, NCCL buffers, fragmentation"
source.nvlink_latency_us = "assumption: ~3 us per ring step (small-message NCCL latency inside a node)"
source.gemm_fraction = "achieved fraction of BF16 peak against the smallest GEMM dimension (m, n, k); shape from published cuBLAS sweeps (Anthony et al. 2024, arXiv:2401.14489, A100 and H100; NVIDIA's Matrix Multiplication Background guide: tile and wave quantization), levels checked by `atlas bench validate` (Megatron-LM SC'21 on A100, Llama 3 on H100)"
source.fused_attention = "FlashAttention (Dao et al. 2022, arXiv:2205.14135), the default of current training stacks; decks of 2021-era runs set train.attention = unfused"
source.nvlink_efficiency = "NCCL all_reduce bus bandwidth of large messages inside one node (nccl-tests): about 235 GB/s on DGX A100 (0.78 x 300), 360 GB/s on DGX H100 (0.8 x 450)"
source.board_power_w = "NVIDIA datasheet: H100 SXM max TDP up to 700 W (the budget a DC reserves per GPU; cluster.pue adds cooling)"
