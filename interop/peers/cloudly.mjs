// Cloudly, played by the published TypedRequest library: a WebSocket server the relay dials (or
// nodes, talking to it directly). It serves the relay's client session and registration and the
// node registrations with the library's TypedRouter, answering the shapes the Go simulator
// (testenv/sim/cloudly.go) answers, pushes the relay configuration after each accepted
// relay registration, serves the suite's own methods, and calls nodes on the socket that carries
// them. It judges the relay registration exact-key, as the seed's validator does, and serves no
// registerClusterVpnHub: the relay's project-defined hub report meets the library's own "no
// available method" answer, exactly what a Cloudly without the method would say.
//
//   node cloudly.mjs '{"token":…,"offer":{…},"clusterId":…,"origin":…}'
//
// Standard input takes commands, standard output answers them (common.mjs); the first line out
// is { event: "ready", url }.

import { WebSocketServer } from 'ws';
import { TypedHandler, TypedRequest, TypedResponseError, VirtualStream } from '@api.global/typedrequest/dist_bundle/bundle.js';

import { emit, fail, outcome, readAll, sendStream, serveControl, unhandled } from './common.mjs';
import { Peer } from './transport.mjs';

const cfg = JSON.parse(process.argv[2] || '{}');
const offer = cfg.offer;
const clusterId = cfg.clusterId || 'cluster-interop';
const origin = cfg.origin || 'https://relay.cluster-interop.serve.zone:8443';

const peers = new Set(); // every socket ever accepted
const nodes = new Map(); // nodeId -> { peer, session }: where Cloudly reaches the node
const received = {}; // requests per method the router serves
const routed = {}; // frames per method handed to the router, served or not
const violations = []; // what a relay sent out of Cloudly's order
const sequences = []; // registrationSequence of every relay registration
let lastSequence = -1;
let relayRegistrations = 0;
let configPushes = 0;
let nextPeer = 0;

function refuseOffer(req) {
  const p = req && req.protocol;
  if (!p || typeof p.interfacesVersion !== 'string' || typeof p.minimumPeerVersion !== 'string') {
    throw new TypedResponseError('relay-request-invalid: protocol must be { interfacesVersion, minimumPeerVersion }');
  }
  if (p.interfacesVersion.split('.')[0] !== offer.interfacesVersion.split('.')[0]) {
    throw new TypedResponseError('protocol-incompatible: major-mismatch', { code: 'protocol-incompatible', reason: 'major-mismatch' });
  }
}

// exactKeys reports whether obj is a plain object with exactly the members keys, in any order.
function exactKeys(obj, keys) {
  return obj !== null && typeof obj === 'object' && !Array.isArray(obj) &&
    JSON.stringify(Object.keys(obj).sort()) === JSON.stringify([...keys].sort());
}

// refuseRegistrationShape judges IRegisterClusterRelayRequest exact-key at every level, as the
// seed's validateRegisterClusterRelayRequest does: any member the seed does not spell (the
// project's old relay.vpnHub guess above all) refuses the whole registration, and is recorded as
// a violation.
function refuseRegistrationShape(req) {
  const exact = exactKeys(req, ['protocol', 'relay', 'registrationSequence']) &&
    exactKeys(req.protocol, ['interfacesVersion', 'minimumPeerVersion']) &&
    exactKeys(req.relay, ['version', 'nodeId', 'listenAddress', 'listenPort']);
  if (!exact) {
    const members = (o) => (o !== null && typeof o === 'object' ? Object.keys(o) : typeof o);
    const text = `relay-request-invalid: cluster relay registration must use its exact schema (members ${JSON.stringify(members(req))}, ` +
      `relay ${JSON.stringify(members(req && req.relay))}, protocol ${JSON.stringify(members(req && req.protocol))})`;
    violations.push(text);
    throw new TypedResponseError(text, { code: 'relay-request-invalid' });
  }
}

// gate is Cloudly's order on one socket, as the simulator's: a socket that opened a client
// session is a relay's and must register before anything else; a socket that did not is a
// node's own (the direct baseline).
function gate(peer, method) {
  received[method] = (received[method] || 0) + 1;
  if (peer.authed && !peer.relay && method !== 'registerClusterRelay') {
    const text = `relay-not-connected: ${method} on a socket whose relay registration Cloudly did not accept`;
    violations.push(text);
    throw new TypedResponseError(text);
  }
}

// knownSession refuses a node → Cloudly request whose session Cloudly did not issue.
function knownSession(req) {
  const id = req && req.session && req.session.nodeId;
  const n = nodes.get(id);
  if (!n || n.session.epoch !== req.session.epoch) {
    throw new TypedResponseError(`session-mismatch: no current session was issued to node ${id}`);
  }
  return id;
}

function serve(peer, method, f) {
  peer.router.addTypedHandler(new TypedHandler(method, async (req) => {
    gate(peer, method);
    return f(req);
  }));
}

function accept(ws) {
  const peer = new Peer(ws, `cloudly-socket-${nextPeer++}`);
  const route = peer.serve.bind(peer);
  peer.serve = (frame) => {
    routed[frame.method] = (routed[frame.method] || 0) + 1;
    return route(frame);
  };
  peer.authed = false; // a client session was accepted on it: it is a relay's
  peer.relay = false; // a relay registration was accepted on it
  peers.add(peer);

  serve(peer, 'registerCloudlyClientSession', async (req) => {
    refuseOffer(req);
    if (!req || req.jwt !== cfg.token) {
      throw new TypedResponseError('unauthenticated: the machine JWT is not valid');
    }
    peer.authed = true;
    return { protocol: offer };
  });

  serve(peer, 'registerClusterRelay', async (req) => {
    if (!peer.authed) {
      const text = 'unauthenticated: registerClusterRelay before registerCloudlyClientSession on this socket';
      violations.push(text);
      throw new TypedResponseError(text);
    }
    refuseOffer(req);
    refuseRegistrationShape(req);
    const seq = req.registrationSequence;
    if (!Number.isInteger(seq) || !req.relay || typeof req.relay.nodeId !== 'string') {
      throw new TypedResponseError('relay-request-invalid: not an IRegisterClusterRelayRequest');
    }
    sequences.push(seq);
    if (seq !== 0 && seq <= lastSequence) {
      const text = `relay-sequence-not-advancing: registrationSequence ${seq} does not exceed the last accepted ${lastSequence}`;
      violations.push(text);
      throw new TypedResponseError(text);
    }
    lastSequence = seq;
    peer.relay = true;
    relayRegistrations++;
    // The configuration push leaves right behind the answer, as Cloudly's does.
    setImmediate(() => pushConfig(peer));
    return { protocol: offer, origin };
  });

  serve(peer, 'registerPalletRuntimeSession', async (req) => {
    refuseOffer(req);
    if (!req || typeof req.nodeId !== 'string' || req.bearer !== `bearer-${req.nodeId}`) {
      throw new TypedResponseError('bearer-refused: the bearer is not the node\'s current credential');
    }
    const prev = nodes.get(req.nodeId);
    const session = {
      controller: { kind: 'cloudly', id: 'cloudly-interop' },
      clusterId,
      nodeId: req.nodeId,
      runtimeNamespace: `rt-${clusterId}`,
      generation: req.credentialGeneration,
      epoch: prev ? prev.session.epoch + 1 : 1,
    };
    nodes.set(req.nodeId, { peer, session });
    return { session, protocol: offer };
  });

  // No handler for registerClusterVpnHub (project-defined): the router answers the relay's hub
  // report with the library's own "There is no available method for this call on the server
  // side", and the relay must stay attached all the same (docs/protocol.md#upstream-session: outbound guesses fail small).

  // The relay pulls the route table after attaching; none is computed yet, as the simulator says.
  serve(peer, 'getClusterRouteTable', async () => ({ table: null }));

  serve(peer, 'interopEcho', async (req) => ({ echo: req, node: knownSession(req) }));

  serve(peer, 'interopFail', async (req) => {
    knownSession(req);
    fail(req);
  });

  serve(peer, 'interopUpload', async (req) => {
    knownSession(req);
    if (!(req.stream instanceof VirtualStream)) {
      throw new TypedResponseError('interop-no-stream: the request carries no VirtualStream');
    }
    return readAll(req.stream);
  });

  ws.on('close', () => {
    for (const [id, n] of nodes) {
      if (n.peer === peer) nodes.delete(id);
    }
  });
}

async function pushConfig(peer) {
  const config = { clusterId, relay: { origin }, corestores: [] };
  const r = await outcome(new TypedRequest(peer.target, 'pushClusterRelayConfig').fire({ config })).catch(() => null);
  if (r && !r.error) configPushes++;
  emit({ event: 'config-pushed', ok: !!(r && !r.error) });
}

function nodePeer(id) {
  const n = nodes.get(id);
  if (!n) throw new Error(`cloudly: node ${id} is not registered`);
  return n;
}

const wss = new WebSocketServer({ host: '127.0.0.1', port: 0, maxPayload: 64 << 20, perMessageDeflate: false });
wss.on('connection', accept);
wss.on('listening', () => emit({ event: 'ready', url: `ws://127.0.0.1:${wss.address().port}/` }));

serveControl({
  // call fires method at a node with the node's session in the body.
  call: async ({ node, method, fields }) => {
    const n = nodePeer(node);
    return outcome(new TypedRequest(n.peer.target, method).fire({ session: n.session, ...fields }));
  },

  // download fires interopDownload at a node with a VirtualStream and writes bytes into it.
  download: async ({ node, bytes, chunk }) => {
    const n = nodePeer(node);
    const body = { session: n.session, stream: new VirtualStream(), size: bytes };
    return sendStream(n.peer, new TypedRequest(n.peer.target, 'interopDownload'), body, bytes, chunk);
  },

  // raw sends a frame built by the suite on the socket that carries node and waits waitMs for
  // its answer (null when none).
  raw: async ({ node, frame, waitMs }) => nodePeer(node).peer.postRaw(frame, waitMs),

  status: async () => ({
    sockets: [...peers].map((p) => ({ name: p.name, relay: p.relay, authed: p.authed, ...p.status() })),
    nodes: [...nodes.keys()].sort(),
    received,
    routed,
    violations,
    sequences,
    relayRegistrations,
    configPushes,
    unhandled,
  }),
});
