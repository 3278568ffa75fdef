// DOT on stdin -> SVG on stdout with the bundled Graphviz (WebAssembly): renders what
// sbs_widget.fx_graph / onnx_graph produce on machines without a system `dot`; the tests use it too.
//   node js/graphs/render-dot.mjs < fx.dot > fx.svg
import { instance } from "@viz-js/viz";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const viz = await instance();
const result = viz.render(Buffer.concat(chunks).toString("utf8"), { format: "svg" });
if (result.status !== "success") {
  for (const e of result.errors) console.error(`${e.level}: ${e.message}`);
  process.exit(1);
}
for (const e of result.errors) console.error(`${e.level}: ${e.message}`);
process.stdout.write(result.output);
