"""Hugging Face transformers models from tiny configs (random init, synthetic batches)
trained 20 AdamW steps under ``ortcpu_torch.optimize()`` vs plain torch: loss curve,
parameters and eval outputs within torch's own float32 drift from a float64 run,
state_dict and save_pretrained/from_pretrained round trips, and a report that accounts
for every module and every torch function. Dropout is 0 so the three runs see the same
function (our dropout draws its masks differently from torch's)."""

from __future__ import annotations

import warnings

import pytest
import torch

import ortcpu_torch

from ..test_wrap_compile import GraphRecorder
from ._train import (
    check_eval,
    check_report,
    check_state_dict_round_trip,
    check_training,
    train_three_ways,
)

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, BATCH = 97, 16, 4


@pytest.fixture(autouse=True)
def _quiet_and_one_thread():
    # tiny models: one thread (on a loaded 2-core machine OpenMP fork-joins of 2 threads
    # made a step 15x slower); conftest restores the settings
    torch.set_num_threads(1)
    ortcpu_torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def _gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB,
                                  n_positions=SEQ, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def _bert():
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.BertForMaskedLM(cfg)


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=SEQ,
                                   attention_dropout=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.LlamaForCausalLM(cfg)


def _vit():
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                                 num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, num_labels=5, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0)
    return transformers.ViTForImageClassification(cfg)


def _convnext():
    cfg = transformers.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1],
                                      num_stages=2, image_size=16, num_labels=5,
                                      drop_path_rate=0.0)
    return transformers.ConvNextForImageClassification(cfg)


def _lm_batches(n=4):
    g = torch.Generator().manual_seed(1)
    return [[torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)] for _ in range(n)]


def _image_batches(n=4):
    g = torch.Generator().manual_seed(2)
    return [[torch.randn(BATCH, 3, 16, 16, generator=g),
             torch.randint(0, 5, (BATCH,), generator=g)] for _ in range(n)]


def _lm_loss(m, b):
    return m(input_ids=b[0], labels=b[0]).loss


def _image_loss(m, b):
    return m(pixel_values=b[0], labels=b[1]).loss


def _lm_forward(batch):
    return lambda m, dtype: m(input_ids=batch[0]).logits


def _image_forward(batch):
    return lambda m, dtype: m(pixel_values=batch[0].to(dtype)).logits


MODELS = {
    "gpt2": (_gpt2, _lm_batches, _lm_loss, _lm_forward),
    "bert": (_bert, _lm_batches, _lm_loss, _lm_forward),
    "llama": (_llama, _lm_batches, _lm_loss, _lm_forward),
    "vit": (_vit, _image_batches, _image_loss, _image_forward),
    "convnext": (_convnext, _image_batches, _image_loss, _image_forward),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_model_trains_like_torch(name, tmp_path):
    build, batches, loss_fn, fwd = MODELS[name]
    data = batches()
    runs = train_three_ways(build, data, loss_fn)
    check_training(runs)
    forward = fwd(data[0])
    ours_out = check_eval(runs, forward)
    check_state_dict_round_trip(runs, build, forward)
    ours = runs["ours"][0]
    # save_pretrained / from_pretrained: the wrapped model saves the plain model's files
    ours.save_pretrained(tmp_path)
    loaded = type(ours).from_pretrained(tmp_path)
    loaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(forward(loaded, torch.float32), ours_out,
                                   rtol=1e-4, atol=1e-5)
    rep = check_report(ours)
    assert rep.modules, "nothing was swapped"
    assert any(d["calls_ours"] for d in rep.modules)


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_compiled_wrapped_model_compiles_once_runs_our_gemms_trains_like_torch(name):
    """``torch.compile(optimize(model))``: GPT-2's Conv1D (``torch.addmm``) and BERT's
    Linear layers run as ortcpu::linear in the graphs, GPT-2's loss function (a logging
    call in it breaks the graph) included; the frames compile on the first step only and
    3 AdamW steps follow plain torch's losses."""
    make, batches, loss_fn, _ = MODELS[name]
    torch.manual_seed(0)
    model = make()
    ref = make()
    ref.load_state_dict(model.state_dict())
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    model, opt = ortcpu_torch.optimize(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                                       fallback="silent", select="ours",
                                       compile_kernels="ours")  # "auto" differs by ISA
    rec = GraphRecorder()
    cm = torch.compile(model, backend=rec)
    frames = []
    for b in batches(3):
        losses = []
        for m, o in ((cm, opt), (ref, opt_ref)):
            o.zero_grad()
            loss = loss_fn(m, b)
            loss.backward()
            o.step()
            losses.append(loss.detach())
        frames.append(rec.frames)
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-5)
    assert frames[0] == frames[-1], frames  # no recompiles after the first step
    assert any(op.startswith("ortcpu.linear") for op in rec.forward), rec.forward
