// Pallet nodes, played by the published TypedRequest library: each node is one WebSocket client
// of the relay's downstream listener (or of Cloudly directly, the baseline). It registers with
// registerPalletRuntimeSession, serves the suite's methods with the library's TypedRouter,
// registers again when the relay says it re-attached, and calls Cloudly with its session.
//
//   node nodes.mjs
//
// Standard input takes commands, standard output answers them (common.mjs).

import { randomUUID } from 'node:crypto';

import { WebSocket } from 'ws';
import { TypedHandler, TypedRequest, TypedResponseError, VirtualStream } from '@api.global/typedrequest/dist_bundle/bundle.js';

import { emit, fail, outcome, readAll, sendStream, serveControl, unhandled } from './common.mjs';
import { Peer } from './transport.mjs';

const nodes = new Map(); // id -> { id, peer, session, offer, nonce, registrations }

// register sends registerPalletRuntimeSession and keeps the session it is answered with, after
// checking it is this node's: an answer carried to the wrong node is not its session.
async function register(n) {
  const body = {
    protocol: n.offer,
    bearer: `bearer-${n.id}`,
    credentialGeneration: 1,
    nodeInstanceNonce: n.nonce,
    nodeId: n.id,
    resolvedAuthorities: ['network', 'secrets', 'storage'],
  };
  const resp = await new TypedRequest(n.peer.target, 'registerPalletRuntimeSession').fire(body);
  if (!resp || !resp.session || resp.session.nodeId !== n.id || !resp.protocol) {
    throw new Error(`node ${n.id}: registration answer is not this node's { session, protocol }`);
  }
  n.session = resp.session;
  n.registrations++;
  return resp;
}

// mine refuses a Cloudly → node request that names another node: the relay routed it wrongly.
function mine(n, req) {
  const id = req && (req.session ? req.session.nodeId : req.nodeId);
  if (id !== n.id) {
    throw new TypedResponseError(`session-mismatch: the request names node ${id}, not ${n.id}`);
  }
}

function serve(n, method, f) {
  n.peer.router.addTypedHandler(new TypedHandler(method, f));
}

async function connect(url, id, offer) {
  const ws = new WebSocket(url, { perMessageDeflate: false, maxPayload: 64 << 20 });
  const n = { id, peer: new Peer(ws, `node ${id}`), session: null, offer, nonce: randomUUID(), registrations: 0, received: {} };
  const count = (m) => { n.received[m] = (n.received[m] || 0) + 1; };

  serve(n, 'interopEcho', async (req) => {
    count('interopEcho');
    mine(n, req);
    return { echo: req, node: n.id };
  });
  serve(n, 'interopFail', async (req) => {
    count('interopFail');
    mine(n, req);
    fail(req);
  });
  serve(n, 'interopDownload', async (req) => {
    count('interopDownload');
    mine(n, req);
    if (!(req.stream instanceof VirtualStream)) {
      throw new TypedResponseError('interop-no-stream: the request carries no VirtualStream');
    }
    return readAll(req.stream);
  });
  serve(n, 'pushRelayUpstreamChanged', async (req) => {
    count('pushRelayUpstreamChanged');
    if (req && req.attached === true) {
      setImmediate(() => register(n).then(
        () => emit({ event: 'reregistered', node: n.id }),
        (err) => console.error(`node ${n.id}: registering again failed:`, err),
      ));
    }
    return {};
  });

  await n.peer.opened;
  nodes.set(id, n);
  return n;
}

function node(id) {
  const n = nodes.get(id);
  if (!n) throw new Error(`node ${id} is not connected`);
  if (!n.session) throw new Error(`node ${id} is not registered`);
  return n;
}

serveControl({
  // connect opens one socket per id to url and registers each node; it resolves when all have
  // an answer, with the ids that registered and each failure.
  connect: async ({ url, ids, offer }) => {
    const results = await Promise.all(ids.map(async (id) => {
      try {
        await register(await connect(url, id, offer));
        return { id };
      } catch (err) {
        return { id, failure: String((err && (err.message || err.errorText)) || err) };
      }
    }));
    return {
      registered: results.filter((r) => !r.failure).map((r) => r.id),
      failures: results.filter((r) => r.failure),
    };
  },

  // call fires method at Cloudly with the node's session in the body.
  call: async ({ node: id, method, fields }) => {
    const n = node(id);
    return outcome(new TypedRequest(n.peer.target, method).fire({ session: n.session, ...fields }));
  },

  // upload has each node fire interopUpload with a VirtualStream, all at once, and write bytes
  // into it.
  upload: async ({ nodes: ids, bytes, chunk }) => {
    const started = process.hrtime.bigint();
    const results = await Promise.all(ids.map((id) => {
      const n = node(id);
      const body = { session: n.session, stream: new VirtualStream(), size: bytes };
      return sendStream(n.peer, new TypedRequest(n.peer.target, 'interopUpload'), body, bytes, chunk)
        .then((r) => ({ node: id, ...r }));
    }));
    return { results, ms: Number(process.hrtime.bigint() - started) / 1e6 };
  },

  // raw sends a frame built by the suite on node's socket and waits waitMs for its answer.
  raw: async ({ node: id, frame, waitMs }) => {
    const n = nodes.get(id);
    if (!n) throw new Error(`node ${id} is not connected`);
    return n.peer.postRaw(frame, waitMs);
  },

  status: async () => ({
    nodes: [...nodes.values()].map((n) => ({
      id: n.id, registrations: n.registrations, received: n.received, ...n.peer.status(),
    })),
    unhandled,
  }),
});
