#!/usr/bin/env node
// greeter: an Ephemera plugin written in JavaScript (api/plugin/v1alpha1).
//
// It provides content only (no CREATE): the driver mounts a tmpfs for each
// volume and writes into it what Content returns, a greeting and the pod's
// identity. It also validates the volume's attributes (VALIDATE) and refuses
// the namespaces it is told to (AUTHORIZE). See README.md.
//
// The protocol's rules (the header of plugin.proto), and where this file keeps them:
//  1. Handshake answers "v1alpha1" only when the driver offers it, else
//     FAILED_PRECONDITION (handshake).
//  2. Calls outside the handshake's capabilities answer UNIMPLEMENTED
//     (notImplemented).
//  3. Content is idempotent: the same volume gets the same files.
//  4. Errors are the protocol's status codes with a message for the pod's
//     author (fail).
//  5. Every call honours the driver's deadline (unary: the work is abandoned
//     and DEADLINE_EXCEEDED answered when it passes).
//  6. Secrets and tokens (Content's secrets and tokens) are never read, logged
//     or written: the call log has the method, the volume ID, the code and the
//     duration, nothing of the request.
// And as a process: the socket is created with mode 0660, a stale socket of a
// dead predecessor is replaced (a served one is not), and SIGTERM or SIGINT
// stop it gracefully (calls in flight finish, at most 10s) and remove its socket.
'use strict';

const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const { parseArgs } = require('node:util');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const NAME = 'greeter';
const VERSION = require('./package.json').version;
const PROTOCOL_VERSION = 'v1alpha1';

// The volume attributes this plugin accepts. The driver removes its own
// ("size", "backend") and the kubelet's ("csi.storage.k8s.io/...") first.
const ATTR_GREETING = 'greeting';
const ACCEPTED_ATTRIBUTES = [ATTR_GREETING];
const MAX_GREETING_BYTES = 128;
// The tmpfs size when the pod sets none: the files are tiny.
const DEFAULT_SIZE_BYTES = 1 << 20;
const FILE_MODE = 0o444;
const SOCKET_MODE = 0o660;
// How long SIGTERM waits for calls in flight before closing their connections.
const SHUTDOWN_GRACE_MS = 10_000;

const { values: flags } = parseArgs({
  options: {
    endpoint: { type: 'string', default: process.env.GREETER_ENDPOINT || 'unix:///run/ephemera/plugins/greeter.sock' },
    proto: { type: 'string', default: process.env.GREETER_PROTO || path.join(__dirname, '..', '..', 'api', 'plugin', 'v1alpha1', 'plugin.proto') },
    'default-greeting': { type: 'string', default: process.env.GREETER_DEFAULT_GREETING || 'Hello' },
    'deny-namespaces': { type: 'string', default: process.env.GREETER_DENY_NAMESPACES || '' },
    verbose: { type: 'boolean', short: 'v', default: process.env.GREETER_VERBOSE === '1' },
    help: { type: 'boolean', short: 'h', default: false },
  },
});

if (flags.help) {
  process.stdout.write(`Usage: node index.js [flags]
  --endpoint URL            socket to serve on, unix:///absolute/path.sock ($GREETER_ENDPOINT;
                            default unix:///run/ephemera/plugins/greeter.sock)
  --proto PATH              plugin.proto of protocol ${PROTOCOL_VERSION} ($GREETER_PROTO;
                            default the repository's api/plugin/v1alpha1/plugin.proto)
  --default-greeting TEXT   greeting of volumes without the "greeting" attribute ($GREETER_DEFAULT_GREETING; default Hello)
  --deny-namespaces NS,...  namespaces whose pods are refused ($GREETER_DENY_NAMESPACES)
  -v, --verbose             log every call: method, volume ID, code, duration ($GREETER_VERBOSE=1)
`);
  process.exit(0);
}

// log writes one JSON line to stderr. Callers pass only what is safe to log:
// never a request's secrets or tokens.
function log(level, msg, fields = {}) {
  process.stderr.write(JSON.stringify({ time: new Date().toISOString(), level, msg, plugin: NAME, ...fields }) + '\n');
}

// fail returns the error a handler throws to answer with code and message.
function fail(code, message) {
  return Object.assign(new Error(message), { code, details: message });
}

function socketPath(endpoint) {
  const p = endpoint.startsWith('unix://') ? endpoint.slice('unix://'.length) : endpoint;
  if (p.includes('://') || !path.isAbsolute(p)) {
    throw new Error(`endpoint ${JSON.stringify(endpoint)}: want unix:///absolute/path.sock`);
  }
  return p;
}

const config = {
  socket: socketPath(flags.endpoint),
  defaultGreeting: flags['default-greeting'],
  deny: new Set(flags['deny-namespaces'].split(',').map((s) => s.trim()).filter(Boolean)),
  verbose: flags.verbose,
};

// greetingOf checks a volume's attributes and returns its greeting.
function greetingOf(attributes) {
  const unknown = Object.keys(attributes).filter((k) => !ACCEPTED_ATTRIBUTES.includes(k)).sort();
  if (unknown.length > 0) {
    throw fail(grpc.status.INVALID_ARGUMENT,
      `unknown volume attribute${unknown.length > 1 ? 's' : ''} ${unknown.map((k) => JSON.stringify(k)).join(', ')}; ` +
      `accepted: ${ACCEPTED_ATTRIBUTES.join(', ')}`);
  }
  const g = attributes[ATTR_GREETING];
  if (g === undefined) {
    return config.defaultGreeting;
  }
  if (g.trim() === '') {
    throw fail(grpc.status.INVALID_ARGUMENT, `attribute ${ATTR_GREETING} is empty; leave it out for "${config.defaultGreeting}"`);
  }
  if (Buffer.byteLength(g) > MAX_GREETING_BYTES) {
    throw fail(grpc.status.INVALID_ARGUMENT, `attribute ${ATTR_GREETING} is ${Buffer.byteLength(g)} bytes long; at most ${MAX_GREETING_BYTES}`);
  }
  if (/[\u0000-\u001f\u007f]/.test(g)) {
    throw fail(grpc.status.INVALID_ARGUMENT, `attribute ${ATTR_GREETING} contains control characters`);
  }
  return g;
}

const capabilities = ['CAPABILITY_VALIDATE', 'CAPABILITY_CONTENT', 'CAPABILITY_AUTHORIZE'];

const handlers = {
  Handshake(req) {
    const offered = req.protocol_versions;
    if (!offered.includes(PROTOCOL_VERSION)) {
      throw fail(grpc.status.FAILED_PRECONDITION,
        `plugin ${NAME} speaks protocol ${PROTOCOL_VERSION}; the driver offered ${JSON.stringify(offered)}`);
    }
    log('info', 'Handshake', { driver: req.driver_name, pluginName: req.plugin_name, node: req.node_id });
    return { name: NAME, version: VERSION, protocol_version: PROTOCOL_VERSION, capabilities };
  },

  Validate(req) {
    const v = req.volume || {};
    greetingOf(v.attributes || {});
    // A size of 0 keeps the pod's; the driver checks it against its limits.
    return { size_bytes: Number(v.size_bytes || 0) === 0 ? DEFAULT_SIZE_BYTES : 0 };
  },

  // Content ignores req.secrets and req.tokens: this plugin needs neither.
  Content(req) {
    const v = req.volume || {};
    const pod = v.pod || {};
    const greeting = greetingOf(v.attributes || {});
    const identity = { namespace: pod.namespace, name: pod.name, uid: pod.uid, serviceAccount: pod.service_account };
    return {
      files: [
        { path: 'greeting', data: Buffer.from(`${greeting}, ${pod.name}!\n`), mode: FILE_MODE },
        { path: 'pod.json', data: Buffer.from(JSON.stringify(identity, null, 2) + '\n'), mode: FILE_MODE },
      ],
    };
  },

  Authorize(req) {
    const ns = req.volume?.pod?.namespace ?? '';
    if (config.deny.has(ns)) {
      return { allowed: false, reason: `pods in namespace ${ns} may not use ${NAME} volumes (denied by the node's ${NAME} plugin)` };
    }
    return { allowed: true };
  },
};

function notImplemented(capability) {
  return () => {
    throw fail(grpc.status.UNIMPLEMENTED, `plugin ${NAME} does not implement ${capability}`);
  };
}
handlers.Create = notImplemented('CREATE');
handlers.Delete = notImplemented('CREATE');
handlers.List = notImplemented('LIST');
handlers.Check = notImplemented('CHECK');

// unary wraps a handler (request, AbortSignal) -> response or promise: it
// answers once, with DEADLINE_EXCEEDED when the driver's deadline passes or
// CANCELLED when the driver gives up, aborting the signal so that work in
// progress stops; an unexpected exception is INTERNAL.
function unary(method, handler) {
  return (call, callback) => {
    const start = process.hrtime.bigint();
    const id = call.request?.volume?.id || '';
    const ac = new AbortController();
    let timer = null;
    let answered = false;
    const answer = (err, resp) => {
      if (answered) {
        return;
      }
      answered = true;
      clearTimeout(timer);
      if (err && typeof err.code !== 'number') {
        log('error', 'Call failed', { method, volume: id, error: String(err && err.message) });
        err = fail(grpc.status.INTERNAL, `plugin ${NAME}: ${method} failed; see the plugin's log`);
      }
      if (err) {
        ac.abort(err);
      }
      if (config.verbose) {
        const code = err ? grpc.status[err.code] : 'OK';
        log('info', 'Call', { method, volume: id, code, ms: Number(process.hrtime.bigint() - start) / 1e6 });
      }
      callback(err, resp);
    };
    const deadline = call.getDeadline();
    const left = deadline instanceof Date ? deadline.getTime() - Date.now() : Number(deadline) - Date.now();
    if (left <= 0) {
      answer(fail(grpc.status.DEADLINE_EXCEEDED, `plugin ${NAME}: ${method}: the deadline passed before it started`));
      return;
    }
    if (Number.isFinite(left) && left < 2 ** 31) { // setTimeout's limit
      timer = setTimeout(() => answer(fail(grpc.status.DEADLINE_EXCEEDED, `plugin ${NAME}: ${method} did not finish before the deadline`)), left);
    }
    call.on('cancelled', () => answer(fail(grpc.status.CANCELLED, `plugin ${NAME}: ${method} canceled by the driver`)));
    Promise.resolve()
      .then(() => handler(call.request, ac.signal))
      .then((resp) => answer(null, resp), (err) => answer(err));
  };
}

// removeStale removes a socket left by a process that is gone, and refuses to
// touch one that is served or anything that is not a socket.
async function removeStale(p) {
  let st;
  try {
    st = fs.lstatSync(p);
  } catch (err) {
    if (err.code === 'ENOENT') {
      return;
    }
    throw err;
  }
  if (!st.isSocket()) {
    throw new Error(`${p} exists and is not a socket; refusing to remove it`);
  }
  const served = await new Promise((resolve, reject) => {
    const c = net.connect(p);
    c.setTimeout(2000, () => { c.destroy(); reject(new Error(`cannot tell whether another process serves ${p}; refusing to remove it`)); });
    c.on('connect', () => { c.destroy(); resolve(true); });
    c.on('error', (err) => (err.code === 'ECONNREFUSED' || err.code === 'ENOENT' ? resolve(false) : reject(err)));
  });
  if (served) {
    throw new Error(`another process serves ${p}`);
  }
  fs.rmSync(p, { force: true });
}

async function main() {
  const definition = protoLoader.loadSync(flags.proto, {
    keepCase: true, // field names as in the .proto (snake_case)
    longs: Number, // sizes and times fit in a double
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const service = grpc.loadPackageDefinition(definition).ephemera.plugin.v1alpha1.Plugin.service;
  const impl = {};
  for (const method of Object.keys(service)) {
    if (!handlers[method]) {
      throw new Error(`${flags.proto} has a method ${method} this plugin does not know (another protocol version?)`);
    }
    impl[method] = unary(method, handlers[method]);
  }

  const sock = config.socket;
  await removeStale(sock);
  fs.mkdirSync(path.dirname(sock), { recursive: true, mode: 0o750 });
  const server = new grpc.Server();
  server.addService(service, impl);
  // The umask makes the socket 0660 from the start (nothing else runs yet);
  // the chmod makes sure of it.
  const umask = process.umask(0o117);
  try {
    await new Promise((resolve, reject) => server.bindAsync(`unix://${sock}`, grpc.ServerCredentials.createInsecure(),
      (err) => (err ? reject(err) : resolve())));
  } finally {
    process.umask(umask);
  }
  fs.chmodSync(sock, SOCKET_MODE);
  const own = fs.lstatSync(sock);

  // removeSocket removes the socket only if it is still ours (not a newer
  // process's that replaced it as stale).
  const removeSocket = () => {
    try {
      const st = fs.lstatSync(sock);
      if (st.dev === own.dev && st.ino === own.ino) {
        fs.rmSync(sock, { force: true });
      }
    } catch (err) {
      if (err.code !== 'ENOENT') {
        log('error', 'Removing the socket', { socket: sock, error: err.message });
      }
    }
  };
  let stopping = false;
  const stop = (signal) => {
    if (stopping) {
      return;
    }
    stopping = true;
    log('info', 'Stopping', { signal });
    const force = setTimeout(() => {
      log('info', 'Calls still in flight after the grace period; closing them', { graceMs: SHUTDOWN_GRACE_MS });
      server.forceShutdown();
    }, SHUTDOWN_GRACE_MS);
    server.tryShutdown(() => {
      clearTimeout(force);
      removeSocket();
      log('info', 'Stopped');
    });
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));

  log('info', 'Serving plugin', {
    version: VERSION, protocol: PROTOCOL_VERSION, endpoint: `unix://${sock}`, capabilities,
    denyNamespaces: [...config.deny],
  });
}

main().catch((err) => {
  log('error', 'Cannot start', { error: err.message });
  process.exit(1);
});
