"""Clean exports give no mismatch, no culprit and no program-mismatch warning, on zoo families and on
transformers families the rules were not written on (OPT, ELECTRA, from configs, untrained: tied and
zero weights left as they are), float32 and float16, torch.onnx's optimizer on and off.

    timeout 1800 python benchmarks/heldout_clean.py
"""

from __future__ import annotations

import contextlib
import io
import warnings


def _heldout(name: str):
    import transformers

    if name == "opt":
        cfg = transformers.OPTConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                                     num_attention_heads=4, max_position_embeddings=64, use_cache=False)
        return transformers.OPTForCausalLM(cfg).eval()
    cfg = transformers.ElectraConfig(vocab_size=500, embedding_size=32, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128, max_position_embeddings=64)
    return transformers.ElectraModel(cfg).eval()


def main() -> int:
    warnings.simplefilter("ignore")
    import torch

    import sbs_widget
    from sbs_widget.samples import zoo

    bad = 0
    cases = [(n, "zoo") for n in ("gpt2", "llama", "bert", "vit", "qwen2", "falcon", "convnext", "resnet", "phi3",
                                  "roberta")] + [("opt", "held out"), ("electra", "held out")]
    for dtype in (torch.float32, torch.float16):
        for i, (name, origin) in enumerate(cases):
            for optimize in ((i % 2 == 0,) if origin == "zoo" else (True, False)):
                torch.manual_seed(0)
                with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                    if origin == "zoo":
                        ep, prog, args, kwargs = zoo.export(name, optimize=optimize, dtype=dtype)
                    else:
                        model, args, kwargs = _heldout(name).to(dtype), (torch.randint(0, 500, (2, 12)),), {}
                        ep = torch.export.export(model, args)
                        prog = torch.onnx.export(ep, args, dynamo=True, optimize=optimize)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    records = list(sbs_widget.run_aligned(ep, prog.model_proto, args, kwargs))
                    found = sbs_widget.find_culprits(records)
                alarms = [w for w in caught if issubclass(w.category, sbs_widget.ProgramMismatchWarning)]
                mismatches = sum(r.status == "mismatch" for r in records)
                bad += bool(mismatches or found or alarms)
                print(f"{name} ({origin}, {str(dtype)[6:]}, optimize={optimize}): {len(records)} records, "
                      f"{mismatches} mismatch, {len(found)} culprits, {len(alarms)} program-mismatch warnings",
                      flush=True)
    print(f"exports with a false alarm: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
