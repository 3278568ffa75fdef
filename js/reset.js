// The reset panel: the names whose torch value replaces the ONNX one on the next run.

import { h, clear } from "./dom.js";
import { visible } from "./format.js";

export function createResetPanel({ getNames, setNames, onRerun, live }) {
  const chips = h("span", { class: "sbs-bar" });
  const input = h("input", { type: "text", placeholder: "names, comma or space separated", "aria-label": "reset names" });
  const add = () => {
    const extra = input.value.split(/[\s,]+/).filter(Boolean);
    if (extra.length) setNames([...new Set([...getNames(), ...extra])]);
    input.value = "";
  };
  input.addEventListener("keydown", (ev) => { if (ev.key === "Enter") add(); });
  const addBtn = h("button", { text: "Add", onclick: add });
  const clearBtn = h("button", { text: "Clear", onclick: () => setNames([]) });
  const rerun = h("button", { class: "sbs-primary sbs-rerun", text: "Rerun with this reset set", onclick: () => onRerun() });
  const el = h("div", { class: "sbs-reset" }, h("span", { class: "sbs-muted", text: "Reset set:" }), chips);
  if (live) el.append(input, addBtn, clearBtn, rerun);
  return {
    el,
    rerun,
    update(running) {
      const names = getNames();
      clear(chips);
      if (!names.length) chips.append(h("span", { class: "sbs-muted", text: "empty (tick rows or type names)" }));
      for (const n of names) {
        const chip = h("span", { class: "sbs-chip" }, h("span", { text: visible(n) }));
        if (live) chip.append(h("button", { text: "×", title: `remove ${visible(n)}`, onclick: () => setNames(getNames().filter((x) => x !== n)) }));
        chips.append(chip);
      }
      clearBtn.disabled = !names.length;
      rerun.disabled = running;
    },
  };
}
