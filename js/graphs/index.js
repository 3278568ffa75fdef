// Graph views (issue 5). Placeholder so the widget bundle builds while the real view is developed.
export function mountGraphs(ctx) {
  const box = document.createElement("div");
  box.className = "sbs-graphs";
  box.textContent = "Graph views: loading…";
  ctx.el.appendChild(box);
  return () => box.remove();
}
