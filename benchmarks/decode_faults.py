"""Decode steps on decoders exported with their KV cache (issue 50): clean exports and faults one forward
call does not show.

For each family (``samples/decoders.py``, plus families the rules were not written on, built here from
their transformers config), exported with its cache and dynamic lengths:
- clean, float32 and float16, ``--steps`` tokens: the first diverging step of each loop (None expected),
  ties and culprits at any diverging step (0 expected);
- each fault of ``samples/decode_faults.py`` (cache update written before the past, cache slice off by
  one, rotary angles shifted past the prompt, attention mask wrong past the prompt): the first diverging
  step of each loop (1 expected: step 0 is the prompt), and whether the lockstep run at that step names
  an edited node first (its name, or the group of ONNX nodes it computes holds one).

    python benchmarks/decode_faults.py                          # 5 families + 3 held out, 32 steps
    python benchmarks/decode_faults.py --families llama --steps 8
"""

from __future__ import annotations

import argparse
import time
import warnings

# families the decode-step rules were not written on: (config class, model class, config arguments)
HELD_OUT = {
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"num_key_value_heads": 2, "head_dim": 16}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {"num_key_value_heads": 2}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"rotary_pct": 0.5}),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {"num_key_value_heads": 2}),
}


def _hit(p, culprit, edited: list[str]) -> bool:
    names = {culprit.onnx_node}
    if culprit.onnx_name in p.index.producer:
        group = p.group(culprit.onnx_name)
        if group is not None:
            names |= {p.index.nodes[i].name for i in group.nodes}
    return bool(names & set(edited))


def _culprit_at(gen, p, edited):
    first = gen.first_divergence
    step = first["open_loop"] if first["open_loop"] is not None else first["closed_loop"]
    if step is None:
        return None, None
    _, found = gen.lockstep(step)
    return step, (found[0], _hit(p, found[0], edited) if edited else None) if found else (None, False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=["llama", "qwen2", "mistral", "phi3", "gpt2", *HELD_OUT])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--fault-steps", type=int, default=4)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    import torch

    from sbs_widget.engine.entry import prepare
    from sbs_widget.samples import decoders
    from sbs_widget.samples.decode_faults import DECODE_FAULTS, mask_beyond
    from sbs_widget.steps.decode import decode

    decoders.FAMILIES.update(HELD_OUT)
    hits, total = 0, 0
    for family in a.families:
        for dtype in (None, torch.float16):
            begin = time.perf_counter()
            try:
                ep, prog, kw = decoders.export_with_cache(family, dtype=dtype)
            except Exception as e:  # an export torch or the exporter cannot do: said, not counted
                print(f"{family} {dtype}: cannot export ({type(e).__name__}: {str(e)[:120]})", flush=True)
                continue
            model = prog.model_proto
            p = prepare(ep, model)
            gen = decode(p, (), kw, steps=a.steps)
            ties = sum(1 for s in gen.steps for ls in (s.closed, s.open) if ls is not None and ls.tie)
            step, culprit = _culprit_at(gen, p, [])
            print(f"{family} {str(dtype or 'float32').removeprefix('torch.')} clean, {a.steps} steps: first divergence "
                  f"{gen.first_divergence}, ties {ties}, culprit at a diverging step: "
                  f"{culprit[0].onnx_node if culprit and culprit[0] else None} ({time.perf_counter() - begin:.0f} s)",
                  flush=True)
            if dtype is not None:
                continue
            faults = {name: build for name, build in DECODE_FAULTS.items()}
            faults["mask wrong past the prompt"] = lambda m: mask_beyond(m, kw["input_ids"].shape[1])
            for name, build in faults.items():
                try:
                    bad, edited = build(model)
                except (ValueError, IndexError, StopIteration) as e:
                    print(f"  {name}: not applicable ({e})", flush=True)
                    continue
                pb = prepare(ep, bad)
                g = decode(pb, (), kw, steps=a.fault_steps)
                step, found = _culprit_at(g, pb, edited)
                total += 1
                hit = bool(found and found[1])
                hits += hit
                print(f"  {name}: first divergence {g.first_divergence}, culprit at step {step}: "
                      f"{found[0].onnx_node if found and found[0] else None} {'HIT' if hit else 'MISS'}", flush=True)
    print(f"faults: the edited node named first at the first diverging step in {hits} of {total}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
