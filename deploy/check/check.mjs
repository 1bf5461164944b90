// SPDX-License-Identifier: Apache-2.0
// Holds deploy/ to what kvpoold documents and does, so the two cannot drift:
//   - every setting in a ConfigMap's kvpoold.conf, and every KVPOOL_* variable
//     a container sets, is one `kvpoold --help` documents;
//   - container ports equal the ports of the rpc/events/admin URLs in the
//     configuration, and of the vLLM wire's per-pool PUB and replay sockets; Services, probes, the NetworkPolicy and the
//     ServiceMonitor use those ports, and the probe and metrics paths are the
//     ones --help names; the grace period covers drain-ms;
//   - the Dockerfiles build with the README's command, run as non-root, expose
//     the same ports and read the same config path;
//   - every metric the Grafana dashboard queries is one kvpoold exports;
//   - kvpoold runs with exactly each ConfigMap's configuration (and the
//     token file the Secret provides), and its /healthz, /readyz, /metrics,
//     RPC and event endpoints answer; a cuda configuration without a GPU must
//     fail with a clear reason.
//
//   node check.mjs BUILD_DIR RENDERED.yaml...
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "../..");
const [build, ...files] = process.argv.slice(2);
const kvpoold = resolve(build, "service/kvpoold"), kvpoolctl = resolve(build, "clients/c/kvpoolctl");
let failures = 0, passes = 0;

function check(ok, what) {
  if (ok) {
    passes++;
  } else {
    failures++;
    console.error(`FAIL: ${what}`);
  }
}

// ---- what kvpoold --help documents ----
const help = spawnSync(kvpoold, ["--help"], { encoding: "utf8" });
if (help.status !== 0) {
  console.error(`FAIL: ${kvpoold} --help did not run (build kvpoold first): ${help.error ?? help.stderr}`);
  process.exit(1);
}
const settings = new Set([...help.stdout.matchAll(/^  --([a-z-]+)/gm)].map((m) => m[1]));
const envVars = new Set([...help.stdout.split("Environment:")[1].matchAll(/KVPOOL_[A-Z_]+/g)].map((m) => m[0]));
const adminLine = help.stdout.split("\n").find((l) => l.startsWith("  --admin"));
const adminPaths = new Set([...adminLine.matchAll(/\/[a-z]+/g)].map((m) => m[0]));
check(settings.has("rpc") && settings.has("config") && envVars.has("KVPOOL_TOKEN_FILE"),
      "--help lists settings and environment variables");
for (const p of ["/healthz", "/readyz", "/metrics"])
  check(adminPaths.has(p), `--help documents ${p}`);
// Every documented setting has its variable, and the other way round.
for (const s of settings)
  if (!["help", "version", "check-config"].includes(s)) // actions, not settings
    check(envVars.has("KVPOOL_" + s.toUpperCase().replaceAll("-", "_")), `--help lists the variable of --${s}`);

function parseConf(text) {
  const out = [];
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const eq = line.indexOf("=");
    out.push(eq < 0 ? [line, ""] : [line.slice(0, eq).trim(), line.slice(eq + 1).trim()]);
  }
  return out;
}
const portOf = (url) => Number(url.match(/:(\d+)\/?$/)?.[1]);
// The vLLM-wire ports a configuration binds, by container port name.
function vllmPorts(conf) {
  const get = (k) => conf.find(([n]) => n === k)?.[1];
  const out = {};
  if (!get("vllm-events") || get("vllm-events") === "none") return out;
  conf.filter(([n]) => n === "pool").forEach(([, spec], i) => {
    const rank = Number(spec.match(/dp_rank=(\d+)/)?.[1] ?? i);
    out[`vllm-pub-${i}`] = portOf(get("vllm-events")) + rank;
    if (get("vllm-replay") && get("vllm-replay") !== "none")
      out[`vllm-rep-${i}`] = portOf(get("vllm-replay")) + rank;
  });
  return out;
}
// The volume mount a file path lives in: the longest mount path containing it.
const mountOf = (c, path) =>
  c.volumeMounts.filter((m) => path.startsWith(m.mountPath + "/"))
    .sort((a, b) => b.mountPath.length - a.mountPath.length)[0];

// ---- the rendered manifests ----
const confs = new Map(); // text -> where it came from
for (const file of files) {
  const objs = parseAllDocuments(readFileSync(file, "utf8")).map((d) => d.toJS()).filter(Boolean);
  const byKind = (k) => objs.filter((o) => o.kind === k);
  const where = file.replace(root + "/", "");
  for (const sts of [...byKind("StatefulSet"), ...byKind("DaemonSet")]) {
    const pod = sts.spec.template.spec;
    const c = pod.containers.find((x) => x.name === "kvpoold");
    check(c, `${where}: a kvpoold container`);
    if (!c) continue;
    // The configuration: --config PATH, from a mounted ConfigMap.
    check(c.args?.[0] === "--config", `${where}: kvpoold gets --config`);
    for (const a of (c.args ?? []).slice(2))
      if (a.startsWith("--"))
        check(settings.has(a.slice(2).split("=")[0]), `${where}: extra argument ${a} is a setting kvpoold --help documents`);
    const confPath = c.args?.[1] ?? "";
    const mount = mountOf(c, confPath);
    const vol = pod.volumes.find((v) => v.name === mount?.name);
    const cm = byKind("ConfigMap").find((x) => x.metadata.name === vol?.configMap?.name);
    const key = confPath.slice((mount?.mountPath ?? "").length + 1);
    check(cm && cm.data?.[key], `${where}: ${confPath} comes from a ConfigMap in the render`);
    if (!cm?.data?.[key]) continue;
    // Settings from the container's KVPOOL_* values override the file's (a component may set them).
    const conf = parseConf(cm.data[key]);
    const fromEnv = (c.env ?? []).filter((e) => e.value !== undefined && e.name.startsWith("KVPOOL_") &&
                                               e.name !== "KVPOOL_TOKEN_FILE")
      .map((e) => [e.name.slice(7).toLowerCase().replaceAll("_", "-"), e.value]);
    const effective = [...conf.filter(([n]) => !fromEnv.some(([m]) => m === n)), ...fromEnv];
    confs.set(cm.data[key], { where, env: c.env ?? [] });
    const get = (k) => conf.filter(([n]) => n === k).map(([, v]) => v);
    for (const [name] of conf)
      check(settings.has(name) && !["config", "help", "version", "check-config"].includes(name),
            `${where}: setting '${name}' in ${key} is one kvpoold --help documents`);
    for (const e of c.env ?? [])
      if (e.name.startsWith("KVPOOL_"))
        check(envVars.has(e.name), `${where}: env ${e.name} is one kvpoold --help documents`);
    const tokenEnv = (c.env ?? []).find((e) => e.name === "KVPOOL_TOKEN_FILE");
    if (tokenEnv) {
      const m = mountOf(c, tokenEnv.value);
      const v = pod.volumes.find((x) => x.name === m?.name);
      check(v?.secret?.secretName, `${where}: KVPOOL_TOKEN_FILE is in a mounted Secret`);
    }
    // Ports: the URLs in the configuration and the container's named ports.
    const want = { rpc: portOf(get("rpc")[0] ?? ""), events: portOf(get("events")[0] ?? ""),
                   admin: portOf(get("admin")[0] ?? "") };
    // vLLM wire: pool i on vllm-events' port + its dp_rank (default i), replay likewise.
    const vllm = vllmPorts(effective);
    Object.assign(want, vllm);
    check(Object.keys(vllm).length === 0 || (c.env ?? []).some((e) => e.name === "KVPOOL_VLLM_POD"),
          `${where}: the vLLM wire's {pod} comes from the pod (KVPOOL_VLLM_POD)`);
    for (const [name, port] of Object.entries(want)) {
      const cp = c.ports.find((p) => p.name === name);
      check(port && cp?.containerPort === port, `${where}: container port ${name} = ${port} (from ${key})`);
    }
    check(get("admin")[0]?.startsWith("http://0.0.0.0:") && get("rpc")[0]?.includes("://0.0.0.0:"),
          `${where}: endpoints listen on all interfaces`);
    for (const [probe, path] of [["startupProbe", "/healthz"], ["livenessProbe", "/healthz"],
                                 ["readinessProbe", "/readyz"]]) {
      const hg = c[probe]?.httpGet;
      check(hg?.path === path && adminPaths.has(hg.path) && (hg.port === "admin" || hg.port === want.admin),
            `${where}: ${probe} GETs ${path} on the admin port`);
    }
    const drain = Number(get("drain-ms")[0] ?? 5000);
    const pre = c.lifecycle?.preStop?.exec?.command;
    const preMs = pre?.[0] === "sleep" ? Number(pre[1]) * 1000 : 0;
    check(pod.terminationGracePeriodSeconds * 1000 > drain + preMs,
          `${where}: grace period ${pod.terminationGracePeriodSeconds} s covers drain-ms ${drain}` +
          ` and the preStop sleep (${preMs} ms)`);
    check(pod.securityContext?.runAsNonRoot && c.securityContext?.readOnlyRootFilesystem &&
          c.securityContext?.capabilities?.drop?.includes("ALL") &&
          c.securityContext?.allowPrivilegeEscalation === false,
          `${where}: non-root, read-only root filesystem, capabilities dropped`);
    const gpu = c.resources?.limits?.["nvidia.com/gpu"];
    check(Boolean(gpu) === (get("executor")[0] === "cuda"),
          `${where}: an nvidia.com/gpu limit exactly when the executor is cuda`);
    // Services route to the named ports; the headless one carries all three.
    // (Only the pool pods' Services and policies: cluster mode adds the master's.)
    const pools = (sel) => Object.entries(sts.spec.selector.matchLabels)
      .every(([k, v]) => sel?.[k] === v);
    for (const svc of byKind("Service").filter((s) => pools(s.spec.selector))) {
      for (const p of svc.spec.ports)
        check(c.ports.some((cp) => cp.name === p.targetPort) && want[p.targetPort] === p.port,
              `${where}: Service ${svc.metadata.name} port ${p.name} -> ${p.targetPort}`);
      if (svc.spec.clusterIP === "None")
        check(sts.spec.serviceName === svc.metadata.name &&
              svc.spec.ports.length === Object.keys(want).length,
              `${where}: the StatefulSet's headless Service exposes rpc, events, admin` +
              ` and the vLLM-wire ports`);
    }
    for (const np of byKind("NetworkPolicy").filter((n) => pools(n.spec.podSelector.matchLabels))) {
      const ports = new Set(np.spec.ingress.flatMap((r) => (r.ports ?? []).map((p) => p.port)));
      for (const p of Object.values(want))
        check(ports.has(p), `${where}: NetworkPolicy admits port ${p}`);
    }
    for (const sm of byKind("ServiceMonitor"))
      for (const ep of sm.spec.endpoints)
        check(ep.port === "admin" && adminPaths.has(ep.path) && ep.path === "/metrics",
              `${where}: ServiceMonitor scrapes /metrics on admin`);
    for (const [k, v] of Object.entries(sts.spec.selector.matchLabels))
      check(sts.spec.template.metadata.labels[k] === v, `${where}: pod labels match the selector`);
    check(Object.keys(sts.metadata.labels).some((k) => k.startsWith("app.kubernetes.io/")),
          `${where}: app.kubernetes.io labels`);
  }
}
check(confs.size >= 2, "renders include a cpu and a gpu configuration");

// ---- Dockerfiles ----
const readme = readFileSync(join(root, "README.md"), "utf8");
const mainCmd = readme.match(/```sh\n([^\n]+)\n/)[1];
const buildCmd = mainCmd.replace(/ && bash tests\/demo\.sh$/, "");
check(buildCmd !== mainCmd, "README's main command ends with the demo");
// The images build with it, lean: no tests or their packages, the commit from a build argument.
const imageCmd = buildCmd.replace("sh tests/deps.sh", "sh tests/deps.sh --build")
  .replace("cmake -S . -B build", "cmake -S . -B build -DKVP_BUILD_TESTS=OFF -DKVP_BUILD_BENCH=OFF " +
           "-DKVP_COMMIT=${KVP_COMMIT}");
check(imageCmd !== buildCmd, "the images' build command derives from the README's");
for (const name of ["Dockerfile", "Dockerfile.cuda"]) {
  const df = readFileSync(join(root, "deploy/docker", name), "utf8");
  check(df.includes(`RUN ${imageCmd}\n`), `${name} builds with the README's command, lean: ${imageCmd}`);
  check(/^FROM [^\n]+ AS build\nARG KVP_COMMIT=unknown$/m.test(df),
        `${name} takes the commit as a build argument (KVP_COMMIT)`);
  // Debian 12 in both stages: deps.sh's package names, and the kvpoold package
  // that tests/check_debian.sh installs into a fresh Debian 12.
  check(/^FROM debian:12 AS build$/m.test(df) && /^FROM debian:12-slim$/m.test(df),
        `${name}: builds on debian:12 and runs on debian:12-slim`);
  check(/^USER 10001:10001$/m.test(df), `${name} runs as a non-root user`);
  check(/^ENTRYPOINT \["\/usr\/bin\/kvpoold"\]$/m.test(df), `${name}: kvpoold is the entrypoint`);
  // The runtime installs the .deb built above, whose dependencies dpkg-shlibdeps
  // computed from the binaries' links, rather than a hand-kept library list.
  check(/^RUN cd build && cpack -G DEB$/m.test(df) &&
        /^COPY --from=build \/src\/build\/kvpoold_\*\.deb \/tmp\/kvpoold\.deb$/m.test(df) &&
        /apt-get install -y --no-install-recommends \/tmp\/kvpoold\.deb/.test(df),
        `${name}: the runtime installs the kvpoold package built in the build stage`);
  check(/^CMD \["--config", "\/etc\/kvpool\/kvpoold.conf"\]$/m.test(df), `${name}: default --config path`);
  check(/^EXPOSE 7470 7471 9471$/m.test(df), `${name} exposes rpc, events, admin`);
  for (const [text] of confs) {
    const c = parseConf(text);
    const ports = ["rpc", "events", "admin"].map((k) => portOf(c.find(([n]) => n === k)[1]));
    check(ports.join(" ") === "7470 7471 9471", `${name}: EXPOSE matches the configuration's ports`);
  }
}

// ---- kvpoold with exactly each configuration ----
const get = (port, path) =>
  fetch(`http://127.0.0.1:${port}${path}`).then(async (r) => [r.status, await r.text()]).catch(() => [0, ""]);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const dashboard = JSON.parse(readFileSync(join(root, "deploy/helm/kvpool/dashboards/kvpool-dashboard.json"), "utf8"));
const onDashboard = new Set(JSON.stringify(dashboard).match(/(kvpool|process)_[a-z_]+/g)
  .map((m) => m.replace(/_(bucket|sum|count)$/, "")));
const dashMetrics = new Set(onDashboard);
// The alerts' metrics too: a rule on a series kvpoold does not export never fires.
for (const file of files)
  for (const o of parseAllDocuments(readFileSync(file, "utf8")).map((d) => d.toJS()).filter(Boolean))
    if (o.kind === "PrometheusRule")
      for (const g of o.spec.groups)
        for (const r of g.rules)
          for (const m of r.expr.match(/kvpool_[a-z_]+/g) ?? [])
            dashMetrics.add(m);
let metricsChecked = false;
const exported = new Set(); // every kvpool_* series the live runs exported, over all configurations

// Each live run's directory (its socket, regions, disk tiers) goes when the check ends.
const runDirs = [];
process.on("exit", () => { for (const d of runDirs) rmSync(d, { recursive: true, force: true }); });
for (const [text, { where, env }] of confs) {
  const dir = mkdtempSync(join(tmpdir(), "kvpool-deploy-"));
  runDirs.push(dir);
  const confFile = join(dir, "kvpoold.conf"), tokenFile = join(dir, "token");
  // A node-local configuration's socket and regions live in host directories: here, in dir.
  writeFileSync(confFile, text.replace(/^rpc = ipc:\/\/.*$/m, `rpc = ipc://${dir}/kvpool.ipc`)
    .replace(/^region-dir = .*$/m, `region-dir = ${dir}`)
    .replace(/,disk=\/[^,\n]*\//g, `,disk=${dir}/`));
  writeFileSync(tokenFile, "deploy-check-token\n");
  const conf = parseConf(text);
  const val = (k) => conf.find(([n]) => n === k)?.[1];
  const childEnv = { ...process.env };
  for (const e of env)
    if (e.value !== undefined || e.name === "KVPOOL_TOKEN_FILE")
      childEnv[e.name] = e.name === "KVPOOL_TOKEN_FILE" ? tokenFile : e.value;
  const child = spawn(kvpoold, ["--config", confFile], { env: childEnv, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (out += d));
  const exited = new Promise((r) => child.on("exit", (code) => r(code)));
  const admin = portOf(val("admin")), rpc = portOf(val("rpc")), events = portOf(val("events"));
  let status = 0;
  for (let i = 0; i < 100 && status !== 200 && child.exitCode === null; i++) {
    await sleep(100);
    [status] = await get(admin, "/readyz");
  }
  if (val("tls-cert")) {
    // TLS files live in a Secret the cluster provides; the TLS paths are
    // tested end to end by test_service_tls. Checked statically only.
    child.kill("SIGKILL");
    console.log(`${where}: TLS configuration checked statically (kvpoold needs the Secret's files)`);
    continue;
  }
  if (val("executor") === "cuda" && status !== 200) {
    const code = await Promise.race([exited, sleep(10000).then(() => "running")]);
    check(code !== 0 && code !== "running" && /(NO_DEVICE|NOT_SUPPORTED): cuda/.test(out),
          `${where}: the cuda configuration without a GPU stops with a reason`);
    console.log(`${where}: kvpoold with this configuration: ${out.trim().split("\n").pop()}`);
    if (code === "running") child.kill("SIGKILL");
    continue;
  }
  check(status === 200, `${where}: kvpoold with this configuration is ready (/readyz 200)`);
  const [hs] = await get(admin, "/healthz");
  check(hs === 200, `${where}: /healthz 200`);
  const [ms, body] = await get(admin, "/metrics");
  const pool = val("pool").match(/name=([^,]+)/)[1];
  check(ms === 200 && body.includes(`kvpool_blocks{pool="${pool}"}`), `${where}: /metrics has pool ${pool}`);
  if (ms === 200) {
    metricsChecked = true;
    for (const m of body.matchAll(/^# TYPE ((kvpool|process)_[a-z_]+)/gm))
      exported.add(m[1]);
  }
  const ctl = (args) => spawnSync(kvpoolctl, ["--url", `tcp://127.0.0.1:${rpc}`, "--pool", pool,
                                              "--timeout-ms", "2000", ...args], { encoding: "utf8" });
  const info = ctl(["--token-file", tokenFile, "info"]);
  check(info.status === 0 && info.stdout.includes(`pool ${pool}`), `${where}: RPC answers with the Secret's token`);
  if (val("region-dir")) {
    // Node-local: the vLLM pods' way in, the ipc socket, and the pool's region in the region dir.
    const reg = spawnSync(kvpoolctl, ["--url", `ipc://${dir}/kvpool.ipc`, "--pool", pool, "--timeout-ms",
                                      "2000", "--token-file", tokenFile, "region"], { encoding: "utf8" });
    check(reg.status === 0 && (reg.stdout.includes(`region ${dir}/kvpool-${pool}-`) ||
                              reg.stdout.includes(`region ${dir}/kvpool-${pool}.region`)),
          `${where}: the pool's region is in the region dir, reached over the ipc socket`);
  }
  const noTok = ctl(["info"]);
  check(noTok.status !== 0 && /UNAUTH/.test(noTok.stderr), `${where}: RPC refuses a client without the token`);
  const evOpen = await new Promise((r) => {
    const s = connect(events, "127.0.0.1", () => { s.destroy(); r(true); });
    s.on("error", () => r(false));
  });
  check(evOpen, `${where}: the event stream listens on ${events}`);
  const effective = [...conf, ...env.filter((e) => e.value !== undefined && e.name.startsWith("KVPOOL_VLLM_"))
    .map((e) => [e.name.slice(7).toLowerCase().replaceAll("_", "-"), e.value])];
  for (const [name, port] of Object.entries(vllmPorts(effective))) {
    const open = await new Promise((r) => {
      const s = connect(port, "127.0.0.1", () => { s.destroy(); r(true); });
      s.on("error", () => r(false));
    });
    check(open, `${where}: the vLLM wire's ${name} listens on ${port}`);
  }
  child.kill("SIGTERM");
  const t0 = Date.now();
  const code = await Promise.race([exited, sleep(Number(val("drain-ms") ?? 5000) + 5000).then(() => "hung")]);
  check(code === 0, `${where}: SIGTERM drains and exits 0 (${code}, ${Date.now() - t0} ms)`);
  if (code === "hung") child.kill("SIGKILL");
  console.log(`${where}: kvpoold ran with this configuration and answered every probe`);
}
check(metricsChecked, "the dashboard was compared with a live /metrics");
// Some series exist only with a feature on (the vLLM wire's): compare with them all.
for (const m of dashMetrics)
  check(exported.has(m), `dashboard and alert metric ${m} is exported by kvpoold`);
// And the other way: every series kvpoold exported in these runs has a panel.
for (const m of exported)
  check(onDashboard.has(m), `exported metric ${m} is on the Grafana dashboard`);

console.log(`check: ${passes} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
