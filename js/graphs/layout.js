// Graphviz layout (DOT -> SVG string) off the main thread: a Worker started from a Blob, so nothing
// needs serving besides the one ESM file. The worker receives the packed @viz-js/viz script and unpacks
// it itself: on the main thread, unpacking waits behind the page's own work (1.2 s measured on the
// 16-layer LLaMA page, against 0.1 s in a worker). Where a Worker cannot start (a strict CSP, an old
// browser, node) the same script runs on the main thread.
import packed from "./viz_source.gen.js";

// base64 -> gzip -> script text. Shared by the worker (as source) and the main-thread fallback.
async function unpack(base64) {
  const binary = atob(base64);
  const bytes = new Uint8Array(binary.length); // a plain loop: Uint8Array.from(str, fn) is 10x slower
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return new Response(stream).text();
}

// The worker: unpack Graphviz, load it, compile the wasm at once (while the view still builds its
// first DOT), then answer {id, dot} with {id, svg} or {id, error}. Requests arriving while it starts wait.
const WORKER = `
const unpack = ${unpack.toString()};
const waiting = [];
(async () => {
  const first = await new Promise((resolve) => { self.onmessage = (event) => {
    if (event.data && event.data.packed !== undefined) resolve(event.data.packed); else waiting.push(event); }; });
  const at = () => performance.timeOrigin + performance.now();
  const times = { started: at() };
  const url = URL.createObjectURL(new Blob([await unpack(first)], { type: "text/javascript" }));
  times.unpacked = at();
  importScripts(url); // defines __sbsViz
  URL.revokeObjectURL(url);
  times.loaded = at();
  const vizPromise = __sbsViz.instance();
  vizPromise.then(() => self.postMessage({ ready: { ...times, ready: at() } }),
    (error) => self.postMessage({ failed: String(error) }));
  const recent = new Map(); // DOT -> SVG of the last views: collapsing back is instant
  let warmed = false;
  const serve = async (event) => {
    const { id, dot } = event.data;
    try {
      if (recent.has(dot)) return self.postMessage({ id, svg: recent.get(dot) });
      const viz = await vizPromise;
      const result = viz.render(dot, { format: "svg" });
      if (result.status !== "success")
        return self.postMessage({ id, error: result.errors.map((e) => e.message).join("; ") });
      recent.set(dot, result.output);
      if (recent.size > 6) recent.delete(recent.keys().next().value);
      self.postMessage({ id, svg: result.output });
      if (!warmed) {
        // V8 first runs the wasm unoptimized and tiers up hot functions as they run: one more
        // layout now, while the user looks at the first graph, makes the next ones ~2x faster.
        warmed = true;
        setTimeout(() => viz.render(dot, { format: "svg" }), 0);
      }
    } catch (error) {
      // Thrown out of the wasm (a stack overflow on a very deep graph): the instance may be left
      // broken, so the page replaces this worker.
      self.postMessage({ id, error: String(error), fatal: true });
    }
  };
  self.onmessage = serve;
  waiting.splice(0).forEach(serve);
})().catch((error) => self.postMessage({ failed: String(error) }));
`;

function startWorker() {
  const url = URL.createObjectURL(new Blob([WORKER], { type: "text/javascript" }));
  try {
    const worker = new Worker(url);
    worker.postMessage({ packed });
    return worker;
  } finally {
    URL.revokeObjectURL(url);
  }
}

const warm = []; // workers started ahead of any graph, handed to the next layouts created

/** Start `n` layout workers now (Graphviz takes ~0.5 s to start in a worker: unpack, compile the
 * wasm), so that graphs shown later appear at layout speed. Safe to call many times. */
export function prewarmLayout(n = 2) {
  try {
    while (warm.length < n) warm.push(startWorker());
  } catch {
    // no workers here: createLayout falls back to the main thread
  }
}

let mainVizPromise = null;

function mainThreadViz() {
  mainVizPromise ??= unpack(packed).then((source) => new Function(`${source}\nreturn __sbsViz;`)().instance());
  return mainVizPromise;
}

/** A layout engine: `render(dot) -> Promise<svg string>`, `dispose()`, `mode()`. One per graph pane,
 * so both panes lay out in parallel and a slow layout of one never delays the other. */
export function createLayout() {
  let worker = null;
  let nextId = 0;
  const pending = new Map();
  let failed = null; // the worker could not start Graphviz: every render goes to the main thread
  const attach = () => {
    worker.onmessage = ({ data }) => {
      if (data.ready) {
        // the worker's steps on the page's timeline (devtools' performance panel, benchmarks)
        for (const [step, t] of Object.entries(data.ready))
          performance.mark(`sbsg:layout-worker-${step}`, { startTime: t - performance.timeOrigin });
        return;
      }
      if (data.failed) {
        failed = data.failed;
        for (const [id, p] of pending) p.fallback(id);
        return;
      }
      const p = pending.get(data.id);
      pending.delete(data.id);
      if (data.fatal) {
        // a fresh Graphviz for the next layouts; the ones waiting go to it
        worker.terminate();
        worker = startWorker();
        attach();
        for (const [id, q] of pending) worker.postMessage({ id, dot: q.dot });
      }
      if (!p) return;
      if (data.error) p.reject(new Error(data.error));
      else p.resolve(data.svg);
    };
    worker.onerror = (e) => {
      e.preventDefault?.();
      failed = e.message || "layout worker failed";
      for (const [id, p] of pending) p.fallback(id);
    };
  };
  try {
    worker = warm.shift() ?? startWorker();
  } catch {
    worker = null;
  }
  if (worker) attach();
  const onMainThread = async (dot) => {
    const viz = await mainThreadViz();
    let result;
    try {
      result = viz.render(dot, { format: "svg" });
    } catch (error) {
      mainVizPromise = null; // see the worker: a new instance for the next layout
      throw error;
    }
    if (result.status !== "success") throw new Error(result.errors.map((e) => e.message).join("; "));
    return result.output;
  };
  return {
    mode: () => (worker && !failed ? "worker" : "main thread"),
    render(dot) {
      if (!worker || failed) return onMainThread(dot);
      return new Promise((resolve, reject) => {
        const id = nextId++;
        const fallback = (key) => {
          pending.delete(key);
          onMainThread(dot).then(resolve, reject);
        };
        pending.set(id, { resolve, reject, fallback, dot });
        worker.postMessage({ id, dot });
      });
    },
    dispose() {
      worker?.terminate();
      pending.clear();
    },
  };
}
