// What the Cloudly and node peers share: the control channel to the Go test, the console, and
// the stream reading and writing every stream check uses.

import { createHash, randomBytes } from 'node:crypto';
import readline from 'node:readline';
import { format } from 'node:util';

import { TypedResponseError } from '@api.global/typedrequest/dist_bundle/bundle.js';

// The library logs to the console (every stream frame, every keep-alive). Standard output is the
// control channel, so the console goes to standard error, which the Go side keeps a tail of.
for (const level of ['log', 'info', 'warn', 'error', 'debug', 'trace']) {
  console[level] = (...args) => process.stderr.write(format(...args) + '\n');
}

export let unhandled = 0;
process.on('unhandledRejection', (err) => {
  unhandled++;
  console.error('unhandled rejection:', err);
});

// emit writes one line to the Go side.
export function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

// serveControl reads commands, one JSON object a line ({ id, cmd, args }), and answers each with
// { id, ok, result } or { id, ok: false, error }. Commands run concurrently. The process ends
// when the Go side closes standard input.
export function serveControl(commands) {
  const rl = readline.createInterface({ input: process.stdin });
  rl.on('line', async (line) => {
    let msg;
    try {
      msg = JSON.parse(line);
    } catch {
      return;
    }
    try {
      const f = commands[msg.cmd];
      if (!f) throw new Error(`unknown command ${msg.cmd}`);
      emit({ id: msg.id, ok: true, result: (await f(msg.args || {})) ?? null });
    } catch (err) {
      emit({ id: msg.id, ok: false, error: String((err && (err.message || err.errorText)) || err) });
    }
  });
  rl.on('close', () => process.exit(0));
}

// outcome runs a TypedRequest and reports how it ended: { response } or { error: { text, data } }
// with data exactly as the library surfaced it (absent stays absent, null stays null).
export async function outcome(promise) {
  try {
    return { response: await promise };
  } catch (err) {
    if (err instanceof TypedResponseError) {
      return { error: { text: err.errorText, data: err.errorData } };
    }
    throw err;
  }
}

// fail throws the TypedResponseError a check asked for: with data when the request has a data
// member, without when it has none.
export function fail(req) {
  if (Object.prototype.hasOwnProperty.call(req, 'data')) {
    throw new TypedResponseError(req.text, req.data);
  }
  throw new TypedResponseError(req.text);
}

export const CLOSING_BIT = '#############CLOSING BIT#############';

// writeRandom writes total random bytes into a VirtualStream in chunks of chunkSize (Buffers,
// as a Node.js program has them), then the library's closing chunk.
export async function writeRandom(stream, total, chunkSize) {
  const hash = createHash('sha256');
  let sent = 0;
  while (sent < total) {
    const chunk = randomBytes(Math.min(chunkSize, total - sent));
    hash.update(chunk);
    sent += chunk.length;
    await stream.sendData(chunk);
  }
  await stream.close(true);
  return { bytes: sent, sha256: hash.digest('hex') };
}

// readAll reads a VirtualStream to its closing chunk.
export async function readAll(stream) {
  const hash = createHash('sha256');
  let bytes = 0;
  for (;;) {
    const chunk = await stream.fetchData();
    if (chunk === CLOSING_BIT) break;
    if (!(chunk instanceof Uint8Array)) {
      throw new TypedResponseError('interop-chunk-unreadable: a stream chunk arrived as ' + typeof chunk);
    }
    hash.update(chunk);
    bytes += chunk.length;
  }
  return { bytes, sha256: hash.digest('hex') };
}

// stallMs is how long a stream frame may wait for its answer before a stream counts as stalled:
// a frame and its answer cross in well under a second here, so this only ends a stream whose
// answers are lost (the library itself would wait for ever).
const stallMs = 30_000;

// sendStream fires a request with a VirtualStream (body.stream) through peer and writes total
// bytes into it while the request is out. It resolves with what was written, how the request
// ended ({ response }, { error } or { failure }: no answer, a stream frame left unanswered for
// stallMs, or one answered by a peer that did not know the stream) and the time from firing to
// the answer.
export async function sendStream(peer, request, body, total, chunkSize) {
  const started = process.hrtime.bigint();
  const answered = outcome(request.fire(body)).catch((err) => ({ failure: String(err.message || err) }));
  let sent = null;
  let writeError = null;
  const writing = writeRandom(body.stream, total, chunkSize).then(
    (s) => { sent = s; },
    (err) => { writeError = String(err.message || err); },
  );
  let watch;
  const stalled = new Promise((resolve) => {
    watch = setInterval(() => {
      const unknown = peer.unknownTo.get(body.stream.streamId);
      if (unknown) {
        resolve({ failure: `stream lost: ${unknown} of its frames were answered by a peer that does not hold the stream (response null)` });
      }
      const w = peer.oldestUnanswered(body.stream.streamId);
      if (w && w.ms > stallMs) {
        resolve({ failure: `stream stalled: its ${w.mainPurpose} frame (cycle ${w.cycleId}) has had no answer for ${w.ms} ms` });
      }
    }, 500);
  });
  const result = await Promise.race([answered, stalled]);
  clearInterval(watch);
  const ms = Number(process.hrtime.bigint() - started) / 1e6;
  // A refused or failed request can leave the library's writer waiting for the far side for
  // ever: give it a moment, then report what was written so far.
  await Promise.race([writing, new Promise((resolve) => setTimeout(resolve, 1000))]);
  return { sent, writeError, ...result, ms };
}
