// Graphviz layout (DOT -> SVG string) off the main thread: a Worker started from a Blob of the bundled
// @viz-js/viz script, so nothing needs serving besides the one ESM file. Where a Worker cannot start
// (a strict CSP, an old browser) the same script runs on the main thread.
import packed from "./viz_source.gen.js";

let sourcePromise = null;

function vizSource() {
  // Decompressed once per module instance (anywidget imports the ESM once per widget model).
  sourcePromise ??= (async () => {
    const binary = atob(packed);
    const bytes = new Uint8Array(binary.length); // a plain loop: Uint8Array.from(str, fn) is 10x slower
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    const text = await new Response(stream).text();
    performance.mark("sbsg:viz-source-ready"); // visible in devtools' performance panel
    return text;
  })();
  return sourcePromise;
}

const WORKER_GLUE = `
// Compile the wasm while the view still builds its first DOT.
const vizPromise = __sbsViz.instance();
vizPromise.then(() => self.postMessage({ ready: true }));
self.onmessage = async (event) => {
  const { id, dot } = event.data;
  try {
    const viz = await vizPromise;
    const result = viz.render(dot, { format: "svg" });
    if (result.status === "success") self.postMessage({ id, svg: result.output });
    else self.postMessage({ id, error: result.errors.map((e) => e.message).join("; ") });
  } catch (error) {
    self.postMessage({ id, error: String(error) });
  }
};`;

function startWorker(source) {
  const url = URL.createObjectURL(new Blob([source, WORKER_GLUE], { type: "text/javascript" }));
  try {
    return new Worker(url);
  } finally {
    URL.revokeObjectURL(url);
  }
}

const warm = []; // workers started ahead of any graph, handed to the next layouts created

/** Start `n` layout workers now (Graphviz takes ~1 s to start in a worker: decode, compile the wasm),
 * so that graphs shown later appear at layout speed. Safe to call many times. */
export function prewarmLayout(n = 2) {
  vizSource()
    .then((source) => {
      while (warm.length < n) warm.push(startWorker(source));
    })
    .catch(() => {}); // no workers here: createLayout falls back to the main thread
}

/** A layout engine: `render(dot) -> Promise<svg string>`, `dispose()`. One per graph pane, so both
 * panes lay out in parallel and a slow layout of one never delays the other. */
export function createLayout() {
  let worker = null;
  let mainViz = null;
  let nextId = 0;
  const pending = new Map();
  const ready = (async () => {
    const source = await vizSource();
    try {
      worker = warm.shift() ?? startWorker(source);
      worker.onmessage = ({ data }) => {
        if (data.ready) return void performance.mark("sbsg:layout-worker-ready");
        const p = pending.get(data.id);
        pending.delete(data.id);
        if (!p) return;
        if (data.error) p.reject(new Error(data.error));
        else p.resolve(data.svg);
      };
      worker.onerror = (e) => {
        for (const p of pending.values()) p.reject(new Error(e.message || "layout worker failed"));
        pending.clear();
      };
    } catch {
      worker = null;
      mainViz = await new Function(`${source}\nreturn __sbsViz;`)().instance();
    }
  })();
  return {
    mode: () => (worker ? "worker" : "main thread"),
    async render(dot) {
      await ready;
      if (!worker) {
        const result = mainViz.render(dot, { format: "svg" });
        if (result.status !== "success") throw new Error(result.errors.map((e) => e.message).join("; "));
        return result.output;
      }
      return new Promise((resolve, reject) => {
        const id = nextId++;
        pending.set(id, { resolve, reject });
        worker.postMessage({ id, dot });
      });
    },
    dispose() {
      worker?.terminate();
      pending.clear();
    },
  };
}
