"""Where the time of one SVD-path κ measurement goes: layer 0, head 0 of the sizing checkpoint (the study's shape),
one random image; J in closed form, then svdvals(J) against QR(Jᵀ) + svdvals(R). Output: svd_timing.txt."""
import time, torch, os, sys
torch.set_num_threads(1)
from transformers import AutoModelForImageClassification
import hf_condinit
from hf_condinit.diagnostics.probes import capture_attention_inputs
from hf_condinit.diagnostics.jacobian import attention_head_jacobian
from hf_condinit.diagnostics.condition_number import head_condition_number
ck = "/work/vision_runs/sizing_default_seed0/checkpoint-316"
model = AutoModelForImageClassification.from_pretrained(ck).eval()
torch.manual_seed(0)
pixels = torch.randn(1, 3, 32, 32)
t = time.perf_counter()
X = capture_attention_inputs(model, pixels, layers=[0])[0].detach().double()
print("capture", time.perf_counter() - t, X.shape, flush=True)
att = model.vit.layers[0].attention
def heads(lin):
    W = lin.weight.detach().double().T  # (D, H*d)
    return [W[:, h*32:(h+1)*32] for h in range(4)], [lin.bias.detach().double()[h*32:(h+1)*32] for h in range(4)]
(wq, bq), (wk, bk), (wv, bv) = heads(att.q_proj), heads(att.k_proj), heads(att.v_proj)
h = 0
t = time.perf_counter()
J = attention_head_jacobian(X, wq[h], wk[h], wv[h], bq[h], bk[h], bv[h], scaling=32 ** -0.5)
print("J", J.shape, time.perf_counter() - t, flush=True)
t = time.perf_counter(); R = torch.linalg.qr(J.T, mode="r")[1]; tq = time.perf_counter() - t
t = time.perf_counter(); s2 = torch.linalg.svdvals(R); ts = time.perf_counter() - t
print("qr", tq, "svdvals(R)", ts, "kappa", float(s2[0] / s2[-1]), flush=True)
t = time.perf_counter(); G = J @ J.T; print("gram", time.perf_counter() - t, flush=True)
t = time.perf_counter(); s1 = torch.linalg.svdvals(J); t1 = time.perf_counter() - t
print("svdvals(J)", t1, "kappa", float(s1[0] / s1[-1]), "max rel diff", float(((s1 - s2).abs() / s1[0]).max()), flush=True)
