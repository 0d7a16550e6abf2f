"""`PolicyUpdater`: micro-batching invariance, LoRA, serving weights, stale rows and a small learning check."""

from __future__ import annotations

import copy

import pytest
import torch

import lightrail.algorithms as algorithms
from lightrail.algorithms import LoraSettings, PolicyUpdater, UpdateConfig, drop_stale_rows, pack_micro_batches
from lightrail.types import TrainingRow
from tests.algorithms.grpo_helpers import make_rows, tiny_llama


def test_public_surface_is_pinned():
    """The algorithms' face exports the algorithms; the model plane's names are `lightrail.model`'s."""
    import lightrail.model

    assert algorithms.__all__ == ["APO", "Chain", "GRPO", "SFT", "TraceFilter"]
    assert lightrail.model.__all__ == [
        "LlamaFactorySettings",
        "LoraSettings",
        "LossNorm",
        "PolicyUpdater",
        "UpdateConfig",
        "drop_stale_rows",
        "loss_weights",
        "pack_micro_batches",
        "policy_loss",
        "token_entropy",
    ]


def test_pack_micro_batches_respects_the_budget():
    lengths = [5, 9, 3, 9, 30, 1]
    batches = pack_micro_batches(lengths, 20)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert batches[0] == [4]  # longer than the budget: alone
    for b in batches[1:]:
        assert len(b) * max(lengths[i] for i in b) <= 20


def _grads_and_weights(updater: PolicyUpdater):
    return {n: (p.grad.clone(), p.detach().clone()) for n, p in updater._trainable.items() if p.grad is not None}


@pytest.mark.parametrize(
    "loss_norm, kl_coef, dtype, tol, loss",
    [
        ("token", 0.0, torch.float64, 1e-10, "vanilla"),
        ("sequence", 0.0, torch.float64, 1e-10, "vanilla"),
        ("rollout", 0.1, torch.float64, 1e-10, "vanilla"),
        ("token", 0.0, torch.float32, 1e-6, "vanilla"),
        # GSPO's ratio is a whole row's: a row's tokens must be one sequence in whatever micro-batch it lands
        ("sequence", 0.0, torch.float64, 1e-10, "gspo"),
        ("token", 0.1, torch.float64, 1e-10, "cispo"),
    ],
)
def test_micro_batching_gives_the_same_step(loss_norm, kl_coef, dtype, tol, loss):
    rows = make_rows(10, seed=1, zero_adv_rows=2)
    base = tiny_llama(seed=3, dtype=dtype)
    dtype_name = str(dtype).removeprefix("torch.")
    results, metrics = [], []
    for budget in (10_000, 40):  # one micro-batch vs several
        cfg = UpdateConfig(
            lr=1e-3, loss_norm=loss_norm, kl_coef=kl_coef, micro_batch_tokens=budget, dtype=dtype_name,
            policy_loss=loss,
        )  # fmt: skip
        upd = PolicyUpdater(copy.deepcopy(base), cfg)
        metrics.append(upd.step(rows))
        results.append(_grads_and_weights(upd))
    assert metrics[0]["micro_batches"] == 1 and metrics[1]["micro_batches"] >= 4
    assert metrics[0]["loss"] == pytest.approx(metrics[1]["loss"], abs=tol)
    one, many = results
    assert one.keys() == many.keys() and len(one) > 0
    for name in one:
        torch.testing.assert_close(one[name][0], many[name][0], atol=tol, rtol=0, msg=f"grad of {name}")
        if dtype == torch.float64:  # fp32 Adam divides by sqrt(v): tiny grads amplify rounding, compare grads only
            torch.testing.assert_close(one[name][1], many[name][1], atol=tol, rtol=0, msg=f"weight {name}")


def test_skipping_zero_advantage_rows_does_not_change_the_gradient():
    rows = make_rows(8, seed=2, zero_adv_rows=3)
    base = tiny_llama(seed=4, dtype=torch.float64)
    out = []
    for skip in (True, False):
        upd = PolicyUpdater(copy.deepcopy(base), UpdateConfig(dtype="float64", skip_zero_advantage_rows=skip))
        m = upd.step(rows)
        out.append((m, _grads_and_weights(upd)))
    (m_skip, g_skip), (m_all, g_all) = out
    assert m_skip["rows_zero_adv_skipped"] == 3 and m_all["rows_zero_adv_skipped"] == 0
    assert m_skip["tokens"] < m_all["tokens"]
    assert m_skip["loss"] == pytest.approx(m_all["loss"], abs=1e-12)
    for name in g_all:
        torch.testing.assert_close(g_skip[name][0], g_all[name][0], atol=1e-12, rtol=0)


def test_metrics_of_an_on_policy_step():
    rows = make_rows(6, seed=5)
    upd = PolicyUpdater(tiny_llama(seed=5), UpdateConfig(micro_batch_tokens=50))
    rows = _on_policy(upd, rows)
    m = upd.step(rows)
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and m["clip_frac"] == 0.0
    assert m["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert 0.0 < m["entropy"] <= torch.log(torch.tensor(64.0)).item() + 1e-4
    assert m["grad_norm"] > 0 and m["lr"] == 5e-4 and m["step"] == 1 and m["skipped"] == 0
    assert m["tokens"] == sum(len(r.input_ids) for r in rows)
    assert m["response_tokens"] == sum(sum(r.loss_mask) for r in rows)
    assert m["tokens_per_s"] > 0


def test_empty_step_and_bad_rows():
    upd = PolicyUpdater(tiny_llama(), UpdateConfig())
    m = upd.step([])
    assert m["rows"] == 0 and m["skipped"] == 1 and m["step"] == 0 and upd.steps == 0
    bad = TrainingRow(input_ids=[1, 2, 3], loss_mask=[0, 1], old_logprobs=[0.0] * 3, advantages=[0.0] * 3)
    with pytest.raises(ValueError, match="same length"):
        upd.step([bad])
    first = TrainingRow(input_ids=[1, 2], loss_mask=[1, 1], old_logprobs=[0.0] * 2, advantages=[1.0] * 2)
    with pytest.raises(ValueError, match="no context"):
        upd.step([first])


def test_stale_rows_are_dropped_and_counted():
    rows = make_rows(9)  # policy versions 0, 1, 2, 0, 1, 2, ...
    kept, dropped = drop_stale_rows(rows, current_version=3, max_staleness=1)
    assert dropped == 6 and all(r.policy_version == 2 for r in kept)
    unknown = TrainingRow(input_ids=[1, 2], loss_mask=[0, 1], old_logprobs=[0.0, -1.0], advantages=[0.0, 1.0])
    assert drop_stale_rows([unknown], 10, 0) == ([unknown], 0)
    upd = PolicyUpdater(tiny_llama(), UpdateConfig())
    m = upd.step(rows, current_version=3, max_staleness=1)
    assert m["rows_stale_dropped"] == 6 and m["rows"] == 3


def test_a_checkpoints_config_with_a_field_removed_since_still_loads():
    """``updater.json`` of a checkpoint written before ``max_staleness`` left `UpdateConfig` (it holds the field)."""
    written = {**UpdateConfig(lr=3e-4).to_json(), "max_staleness": None}
    assert UpdateConfig.from_json(written) == UpdateConfig(lr=3e-4)


def test_lora_trains_the_adapter_only_and_serves_merged_weights():
    model = tiny_llama(seed=7)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    upd = PolicyUpdater(model, UpdateConfig(lr=1e-2, kl_coef=0.05, lora=LoraSettings(r=4, alpha=8)))
    assert all(".lora_" in n for n in upd._trainable)
    served0 = upd.state_dict_for_serving()
    assert served0.keys() == base_state.keys()
    for k in base_state:  # B = 0 at start: merged == base
        torch.testing.assert_close(served0[k], base_state[k], atol=0, rtol=0)

    rows = make_rows(6, seed=8)
    upd.step(rows)
    m = upd.step(rows)
    assert m["kl_ref"] > 0  # the reference (adapter disabled) now differs from the policy

    # Base weights untouched.
    base_now = {k.replace(".base_layer.", "."): v for k, v in upd.model.get_base_model().state_dict().items()}
    for k, v in base_state.items():
        torch.testing.assert_close(base_now[k], v, atol=0, rtol=0)

    served = upd.state_dict_for_serving()
    assert any(not torch.equal(served[k], base_state[k]) for k in base_state)
    # A plain model with the served weights computes what the adapted model computes.
    plain = tiny_llama(seed=99)
    plain.load_state_dict(served)
    ids = torch.tensor([rows[0].input_ids])
    with torch.no_grad():
        upd.model.eval()
        expected = upd.model(input_ids=ids).logits
        torch.testing.assert_close(plain(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)
        # Serving did not merge anything into the training model.
        torch.testing.assert_close(upd.model(input_ids=ids).logits, expected, atol=0, rtol=0)
    assert not any(getattr(mod, "merged", False) for mod in upd.model.modules())


def test_full_fine_tuning_serving_state_loads_into_the_engine_model_shape():
    model = tiny_llama(seed=1)
    upd = PolicyUpdater(model, UpdateConfig(lr=1e-2))
    upd.step(make_rows(4))
    plain = tiny_llama(seed=2)
    plain.load_state_dict(upd.state_dict_for_serving())
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, upd.model(input_ids=ids).logits)


def _on_policy(upd: PolicyUpdater, rows: list[TrainingRow]) -> list[TrainingRow]:
    """The rows with ``old_logprobs`` replaced by the current policy's (what a sampler serving it would report)."""
    out = []
    for row, logp in zip(rows, upd.token_logprobs(rows), strict=True):
        it = iter(logp)
        old = [next(it) if m else 0.0 for m in row.loss_mask]
        out.append(TrainingRow(**{**{f: getattr(row, f) for f in row.__struct_fields__}, "old_logprobs": old}))
    return out


@pytest.mark.parametrize("lora", [None, LoraSettings(r=8, alpha=16)])
def test_positive_advantage_raises_the_likelihood_of_the_rewarded_sequence(lora):
    torch.manual_seed(0)
    prompt = [5, 17, 3, 42, 8]
    response = [11, 60, 2, 33, 33, 9]
    row = TrainingRow(
        input_ids=prompt + response,
        loss_mask=[0] * len(prompt) + [1] * len(response),
        old_logprobs=[0.0] * (len(prompt) + len(response)),
        advantages=[0.0] * len(prompt) + [1.0] * len(response),
    )
    upd = PolicyUpdater(tiny_llama(seed=11, hidden=64), UpdateConfig(lr=1e-2 if lora else 3e-3, lora=lora))
    before = sum(upd.token_logprobs([row])[0])
    history = []
    for _ in range(15):
        history.append(upd.step(_on_policy(upd, [row])))
    after = sum(upd.token_logprobs([row])[0])
    assert after > before + 3.0, (before, after)  # random init: ~6 tokens at ~ -ln(64) each
    assert history[-1]["entropy"] < history[0]["entropy"]


def test_sft_objective_is_the_masked_token_nll_and_learns():
    rows = make_rows(4, seed=3)
    model = tiny_llama(seed=1)
    expected = 0.0
    with torch.no_grad():  # HF's own mean NLL over the masked tokens of all rows, computed independently
        n_tok = 0
        for r in rows:
            ids = torch.tensor([r.input_ids])
            logits = model(ids).logits[0, :-1]
            logp = torch.log_softmax(logits.double(), -1).gather(1, ids[0, 1:, None])[:, 0]
            mask = torch.tensor(r.loss_mask[1:], dtype=torch.bool)
            expected += float(-logp[mask].sum())
            n_tok += int(mask.sum())
    upd = PolicyUpdater(model, UpdateConfig(lr=1e-2, loss_norm="token", compute_entropy=False))
    first = upd.step(rows, objective="sft")
    assert first["loss"] == pytest.approx(expected / n_tok, rel=1e-4)
    for _ in range(10):
        last = upd.step(rows, objective="sft")
    assert last["loss"] < first["loss"] - 0.5


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_merged_calls_give_the_same_token_mean_step_as_one_row_per_call(kl_coef):
    """`GRPO(merge_calls=True)`: a rollout's turns as one row (each prompt token once) train exactly what one row per
    call trains under the token mean, so merging is a pure speed-up there."""
    import random

    from lightrail.adapters import to_rows
    from lightrail.types import Transition
    from tests.algorithms.grpo_helpers import VOCAB

    rng = random.Random(5)
    transitions = []
    for r in range(4):  # 4 rollouts of 2 turns: turn 1's prompt is turn 0's prompt + answer + a tool result
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(4, 9))]
        answer = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 6))]
        tool = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 4))]
        second = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 5))]
        for turn, (p, resp, adv) in enumerate(
            [(prompt, answer, 0.7 - r * 0.4), (prompt + answer + tool, second, 0.2 - r)]
        ):
            transitions.append(Transition(
                rollout_id=f"ro-{r}", attempt_id=f"at-{r}", prompt_ids=p, response_ids=resp, turn=turn, advantage=adv,
                logprobs=[-rng.uniform(2.0, 4.0) for _ in resp], policy_version=0,
            ))  # fmt: skip
    base = tiny_llama(seed=6, dtype=torch.float64)
    out = []
    for merge in (False, True):
        rows, drift = to_rows(transitions, merge=merge)
        assert len(rows) == (4 if merge else 8) and sum(d.merged for d in drift) == (4 if merge else 0)
        upd = PolicyUpdater(copy.deepcopy(base), UpdateConfig(lr=1e-3, kl_coef=kl_coef, dtype="float64"))
        out.append((upd.step(rows), _grads_and_weights(upd)))
    (m_calls, g_calls), (m_merged, g_merged) = out
    assert m_merged["tokens"] < m_calls["tokens"]  # fewer tokens through the model
    assert m_merged["loss"] == pytest.approx(m_calls["loss"], abs=1e-12)
    assert g_calls.keys() == g_merged.keys() and len(g_calls) > 0
    for name in g_calls:
        # float64 up to the rotary embedding's float32 tables: ~1e-8 of the gradient's size, where a turn trained
        # without its context or with another turn's advantage is off by ~1e-2
        torch.testing.assert_close(g_merged[name][0], g_calls[name][0], atol=1e-9, rtol=1e-6, msg=f"grad of {name}")


def test_autocast_trains_in_bfloat16_and_keeps_float32_weights():
    """Mixed precision: the step runs in bfloat16 (its logprobs are not float32's) and moves the float32 master
    weights the way the float32 step does."""
    rows = make_rows(6, seed=7)
    base = tiny_llama(seed=7)
    full, mixed = (
        PolicyUpdater(copy.deepcopy(base), UpdateConfig(lr=1e-3, autocast=autocast)) for autocast in (None, "bfloat16")
    )
    exact, approx = full.token_logprobs(rows), mixed.token_logprobs(rows)
    diffs = [abs(a - b) for x, y in zip(exact, approx, strict=True) for a, b in zip(x, y, strict=True)]
    assert 0 < max(diffs) < 0.1  # bfloat16 activations: close to float32, not equal

    steps = [upd.step(rows) for upd in (full, mixed)]
    assert steps[1]["loss"] == pytest.approx(steps[0]["loss"], abs=0.02)
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())
    one, two = _grads_and_weights(full), _grads_and_weights(mixed)
    flat = [torch.cat([g[name][0].flatten() for name in sorted(one)]) for g in (one, two)]
    assert torch.nn.functional.cosine_similarity(*flat, dim=0) > 0.98


@pytest.mark.parametrize("lora", [None, LoraSettings(r=4, alpha=8)])
def test_autocast_keeps_the_lm_head_in_float32(lora):
    """Under mixed precision the decoder runs in bfloat16 but the LM head gives float32 logits, for the policy and
    for the KL reference (full and LoRA): bfloat16 logits (2-3 significant digits) cost the distilled calculator
    student 0.555 -> 0.45 held out, float32 ones gave 0.68."""
    rows = make_rows(4, seed=9)
    upd = PolicyUpdater(tiny_llama(seed=9), UpdateConfig(autocast="bfloat16", kl_coef=0.05, lora=lora))
    heads = [upd.model.get_output_embeddings()]  # with LoRA the reference is the same model, adapters disabled
    if upd.reference is not None:
        heads.append(upd.reference.get_output_embeddings())
    decoder = upd.model.get_decoder().layers[0].mlp.down_proj
    seen: dict[str, list[torch.dtype]] = {"head": [], "decoder": []}
    hooks = [m.register_forward_hook(lambda _m, _a, out: seen["head"].append(out.dtype)) for m in heads]
    hooks.append(decoder.register_forward_hook(lambda _m, _a, out: seen["decoder"].append(out.dtype)))
    try:
        upd.step(rows)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(seen["head"]) >= 2 and all(d == torch.float32 for d in seen["head"])  # policy's and reference's
    assert seen["decoder"] and all(d == torch.bfloat16 for d in seen["decoder"])  # the decoder itself is bfloat16


def test_autocast_sft_step_learns():
    """SFT in mixed precision: repeated steps on the same rows lower their negative log-likelihood."""
    rows = make_rows(6, seed=8)
    upd = PolicyUpdater(tiny_llama(seed=8), UpdateConfig(lr=1e-2, autocast="bfloat16"))
    losses = [upd.step(rows, objective="sft")["pg_loss"] for _ in range(8)]
    assert losses[-1] < 0.8 * losses[0]


def test_autocast_is_validated():
    with pytest.raises(ValueError, match="autocast must be bfloat16"):
        UpdateConfig(autocast="float16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="float32 master weights"):
        UpdateConfig(autocast="bfloat16", dtype="float64")


def test_split_groups_keeps_groups_whole_and_in_order():
    from lightrail.model.updater import split_groups

    rows = make_rows(10, seed=6)
    for i, r in enumerate(rows):
        r.group_id = f"g-{i // 2}"  # five groups of two
    parts = split_groups(rows, 2)
    assert [[r.group_id for r in p] for p in parts] == [
        ["g-0", "g-0", "g-1", "g-1"],
        ["g-2"] * 2 + ["g-3"] * 2 + ["g-4"] * 2,
    ]
    assert [r for p in split_groups(rows, 9) for r in p] == rows and len(split_groups(rows, 9)) == 5
    assert split_groups(rows, 1) == [rows] and split_groups([], 3) == []


def test_mini_batches_take_one_optimizer_step_per_mini_batch_in_order():
    """``mini_batches: 2`` is the same as two `step`s, one per half of the groups (each normalised on its own):
    the second runs on the weights the first left, and its rows' ratios move off 1."""
    rows = make_rows(8, seed=7)
    for i, r in enumerate(rows):
        r.group_id = f"g-{i // 4}"
    base = tiny_llama(seed=8, dtype=torch.float64)
    first = PolicyUpdater(copy.deepcopy(base), UpdateConfig(dtype="float64", lr=1e-2))
    rows = _on_policy(first, rows)
    split = PolicyUpdater(copy.deepcopy(base), UpdateConfig(dtype="float64", lr=1e-2, mini_batches=2))
    m = split.step(rows)
    one_by_one = [first.step(rows[:4]), first.step(rows[4:])]
    assert m["step"] == 2 == first.steps and m["optimizer_steps"] == 2 and m["skipped"] == 0
    assert m["mismatch_kl"] == pytest.approx(0.0, abs=1e-9)  # the first mini-batch is on-policy, and only it counts
    assert [r.row.group_id for r in split.last_mismatch] == ["g-0"] * 4
    assert one_by_one[1]["approx_kl"] > 1e-6  # the second is not: the weights moved
    assert m["loss"] == pytest.approx(sum(s["loss"] for s in one_by_one), abs=1e-12)
    assert m["rows"] == 8 and m["response_tokens"] == sum(s["response_tokens"] for s in one_by_one)
    for name, p in split._trainable.items():
        torch.testing.assert_close(p.detach(), first._trainable[name].detach(), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="mini_batches"):
        UpdateConfig(mini_batches=0)


def test_the_policy_loss_setting_reaches_the_step():
    """``policy_loss`` picks the step's term: the same rows give three different losses (each proven equal to
    verl's in tests/trainer/test_verl_parity.py)."""
    rows = make_rows(6, seed=7)
    base = tiny_llama(seed=7, dtype=torch.float64)
    losses = {
        name: PolicyUpdater(copy.deepcopy(base), UpdateConfig(dtype="float64", policy_loss=name)).step(rows)["loss"]
        for name in ("vanilla", "gspo", "cispo")
    }
    assert len({round(v, 9) for v in losses.values()}) == 3, losses
