// The socket transport under the published TypedRequest library: one WebSocket, one Peer.
//
// The library builds and reads every frame (TypedRequest.fire, TypedRouter.routeAndAddResponse,
// VirtualStream); this file only moves them: JSON.stringify of exactly what the library hands
// over, JSON.parse of exactly what arrives, never a member added, dropped or corrected. Its one
// job beyond that is to know which arriving frame answers which sent one:
//
//   - A frame with correlation.phase "response" answers the request with that correlation.id.
//   - A stream frame (method "##VirtualStream##") carries no correlation when the library sends
//     it, and the library answers it without one (a chunk answer even has request: null), so
//     nothing in the frame says "answer". It answers one of ours exactly when its stream cycle
//     id (response.cycleId, else request.cycleId) is one we sent and are waiting for; otherwise
//     it is the other side's request and goes to the router. Cycle ids are the library's
//     isounique ids, unique per cycle, so the two sides' ids do not meet.
//   - Anything else with a correlation is a request for the router.
// docs/decisions.md ("Interop peers") says why.

import { TypedRouter, TypedTarget } from '@api.global/typedrequest/dist_bundle/bundle.js';

export const STREAM_METHOD = '##VirtualStream##';

const defaultTimeoutMs = 120_000;

export class Peer {
  constructor(ws, name) {
    this.ws = ws;
    this.name = name;
    this.router = new TypedRouter();
    // The target every TypedRequest of this peer fires through: postMethod returns the answer,
    // which is the only way the library's stream frames (no correlation) can be answered.
    this.target = new TypedTarget({ postMethod: (frame) => this.post(frame) });
    this.byCorrelation = new Map(); // correlation.id -> waiter
    this.byCycle = new Map(); // stream cycleId -> waiter
    this.stray = 0; // answers nobody waited for
    this.unknownTo = new Map(); // streamId -> stream answers without a response: the far side did not know the stream
    this.malformed = 0; // frames that were not JSON text
    this.routeFailures = 0; // frames the library's router threw on
    this.closed = null; // { code, reason } once the socket closed
    this.opened = new Promise((resolve, reject) => {
      ws.once('open', resolve);
      ws.once('error', reject);
    });
    this.opened.catch(() => {}); // a socket that never opens closes too: gone() reports it
    ws.on('error', () => {}); // the close event follows and says what happened
    ws.on('message', (data, isBinary) => this.receive(data, isBinary));
    ws.on('close', (code, reason) => this.gone(code, reason.toString()));
  }

  get open() {
    return this.closed === null && this.ws.readyState === 1;
  }

  // post sends one frame the library built and resolves with its answer.
  post(frame, timeoutMs = defaultTimeoutMs) {
    return this.wait(frame, timeoutMs, false);
  }

  // postRaw sends a frame this suite built (a stream frame with a correlation, say) and resolves
  // with its answer, or with null when none came within waitMs.
  postRaw(frame, waitMs) {
    return this.wait(frame, waitMs, true);
  }

  wait(frame, timeoutMs, nullOnTimeout) {
    if (!this.open) {
      return Promise.reject(new Error(`${this.name}: socket closed (${this.closeText()})`));
    }
    const keys = [];
    if (frame.correlation && typeof frame.correlation.id === 'string') {
      keys.push([this.byCorrelation, frame.correlation.id]);
    }
    if (frame.method === STREAM_METHOD && frame.request && frame.request.cycleId !== undefined) {
      keys.push([this.byCycle, frame.request.cycleId]);
    }
    return new Promise((resolve, reject) => {
      const done = (fn, v) => {
        clearTimeout(waiter.timer);
        for (const [map, key] of keys) map.delete(key);
        fn(v);
      };
      const waiter = {
        frame,
        sentAt: Date.now(),
        resolve: (v) => done(resolve, v),
        reject: (e) => done(reject, e),
        timer: setTimeout(() => {
          if (nullOnTimeout) waiter.resolve(null);
          else waiter.reject(new Error(`${this.name}: no answer to ${frame.method} within ${timeoutMs} ms`));
        }, timeoutMs),
      };
      for (const [map, key] of keys) map.set(key, waiter);
      this.ws.send(JSON.stringify(frame), (err) => {
        if (err) waiter.reject(err);
      });
    });
  }

  receive(data, isBinary) {
    let frame;
    try {
      if (isBinary) throw new Error('binary');
      frame = JSON.parse(data.toString());
    } catch {
      this.malformed++;
      return;
    }
    if (frame === null || typeof frame !== 'object') {
      this.malformed++;
      return;
    }
    const corr = frame.correlation;
    const corrId = corr && typeof corr.id === 'string' ? corr.id : undefined;
    if (corr && corr.phase === 'response') {
      const w = this.byCorrelation.get(corrId);
      if (w) w.resolve(frame);
      else this.stray++;
      return;
    }
    if (frame.method === STREAM_METHOD) {
      const cycleId = (frame.response && frame.response.cycleId) ?? (frame.request && frame.request.cycleId);
      const w = cycleId !== undefined ? this.byCycle.get(cycleId) : undefined;
      if (w) {
        if (frame.response == null && frame.error == null) {
          // The library answers a stream frame it cannot place with the frame itself.
          const id = w.frame.request.streamId;
          this.unknownTo.set(id, (this.unknownTo.get(id) || 0) + 1);
        }
        w.resolve(frame);
        return;
      }
    }
    this.serve(frame);
  }

  async serve(frame) {
    let answer;
    try {
      answer = await this.router.routeAndAddResponse(frame);
    } catch (err) {
      this.routeFailures++;
      console.error(`${this.name}: the router threw on ${frame.method}:`, err);
      return;
    }
    if (answer && this.open) {
      this.ws.send(JSON.stringify(answer));
    }
  }

  // oldestUnanswered is the stream frame of streamId that has waited longest for its answer, and
  // for how many milliseconds, or null when none waits.
  oldestUnanswered(streamId) {
    let oldest = null;
    for (const w of this.byCycle.values()) {
      if (w.frame.request.streamId === streamId && (!oldest || w.sentAt < oldest.sentAt)) oldest = w;
    }
    return oldest && { ms: Date.now() - oldest.sentAt, mainPurpose: oldest.frame.request.mainPurpose, cycleId: oldest.frame.request.cycleId };
  }

  gone(code, reason) {
    this.closed = { code, reason };
    const err = new Error(`${this.name}: socket closed (${this.closeText()})`);
    for (const map of [this.byCorrelation, this.byCycle]) {
      for (const w of [...map.values()]) w.reject(err);
    }
  }

  closeText() {
    return this.closed ? `${this.closed.code} ${this.closed.reason}`.trim() : 'not open';
  }

  status() {
    return {
      open: this.open,
      closeCode: this.closed ? this.closed.code : 0,
      closeReason: this.closed ? this.closed.reason : '',
      stray: this.stray,
      malformed: this.malformed,
      routeFailures: this.routeFailures,
    };
  }
}
