/**
 * Admission control for one api process: a cap on requests in flight and on event-loop delay
 * (perf_hooks.monitorEventLoopDelay). Above either, a request is answered at once with
 * 503 OVERLOADED and Retry-After instead of joining a queue whose wait grows with the load: a
 * fast refusal lets the buyer's client (or the gateway) retry another replica, while a slow
 * answer holds a connection and still ends in a timeout. Mounted after /healthz, /readyz and
 * /metrics, which stay answerable; readiness reports shedding (docs/operator.md).
 *
 * A request with a body counts in flight from the moment its body has been read (`bodyRead`,
 * mounted after each body reader), not from its arrival: a body still on the wire costs this
 * process nothing but a socket, and counting it let a few hundred clients that send their bodies
 * slowly (or never) fill the cap and have every buyer refused OVERLOADED. The check at arrival
 * still refuses early; the count after the body checks the cap again.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { ELDHistogram } from 'node:perf_hooks';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import type { RequestHandler, Response } from 'express';
import type { Metrics } from '../../core/metrics.js';
import { sendProblem } from './problem.js';

export interface AdmissionOptions {
  metrics: Metrics;
  /** Most requests this process works on at once; 0 = no cap. */
  maxInFlight: number;
  /** Shed while the p99 event-loop delay of the last sampling window is above this; 0 = off. */
  maxEventLoopDelayMs: number;
  /** Length of one sampling window. */
  sampleIntervalMs: number;
  /** Retry-After of a shed request. */
  retryAfterSeconds: number;
}

/** The counter a response counts in while it is in flight. */
const IN_FLIGHT = Symbol('inFlight');
type CountedResponse = ServerResponse & { [IN_FLIGHT]?: { inFlight: number } | undefined };
/** Marks a response whose request was admitted but is counted only once its body is read. */
const AWAITING_BODY = Symbol('awaitingBody');
type AdmittedResponse = CountedResponse & { [AWAITING_BODY]?: boolean };

/** type-is' hasBody: a Transfer-Encoding, or a Content-Length other than 0. */
function carriesBody(req: IncomingMessage): boolean {
  const h = req.headers;
  if (h['transfer-encoding'] !== undefined) return true;
  const length = h['content-length'];
  return length !== undefined && length !== '0';
}

/**
 * 'close' fires for every response, finished or aborted: one listener shared by all responses
 * (no closure per request), and the mark cleared so that a second 'close' cannot count twice.
 */
function released(this: CountedResponse): void {
  const counter = this[IN_FLIGHT];
  if (!counter) return;
  this[IN_FLIGHT] = undefined;
  counter.inFlight -= 1;
}

export type ShedReason = 'in_flight' | 'event_loop_delay';

export class AdmissionControl {
  /** An object of its own: the responses in flight point to it (see `released`). */
  private readonly counter = { inFlight: 0 };
  private loopDelayHigh = false;
  private lastDelayMs = 0;
  private readonly histogram: ELDHistogram;
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly opts: AdmissionOptions) {
    this.histogram = monitorEventLoopDelay({ resolution: 10 });
  }

  start(): this {
    this.histogram.enable();
    this.timer = setInterval(() => {
      this.sample();
    }, this.opts.sampleIntervalMs);
    this.timer.unref();
    return this;
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.histogram.disable();
  }

  /**
   * Reads the window's p99 (nanoseconds in the histogram) and starts a new window. The in-flight
   * gauge is set here, once per window, not twice per request (a gauge set costs a label hash).
   */
  private sample(): void {
    this.opts.metrics.requestsInFlight.set(this.counter.inFlight);
    if (this.histogram.count === 0) return;
    this.lastDelayMs = this.histogram.percentile(99) / 1e6;
    this.histogram.reset();
    this.opts.metrics.eventLoopDelay.observe(this.lastDelayMs / 1000);
    this.loopDelayHigh =
      this.opts.maxEventLoopDelayMs > 0 && this.lastDelayMs > this.opts.maxEventLoopDelayMs;
    this.opts.metrics.shedding.set(this.shedding() ? 1 : 0);
  }

  /** Why this process sheds right now, or undefined when it admits requests. */
  shedding(): ShedReason | undefined {
    if (this.loopDelayHigh) return 'event_loop_delay';
    if (this.opts.maxInFlight > 0 && this.counter.inFlight >= this.opts.maxInFlight) return 'in_flight';
    return undefined;
  }

  get requestsInFlight(): number {
    return this.counter.inFlight;
  }

  get eventLoopDelayMs(): number {
    return this.lastDelayMs;
  }

  private shed(res: Response, reason: ShedReason): void {
    this.opts.metrics.shed.inc({ reason });
    res.setHeader('retry-after', String(this.opts.retryAfterSeconds));
    sendProblem(
      res,
      'OVERLOADED',
      reason === 'in_flight' ? 'too many requests in progress; retry' : 'the server is saturated; retry',
    );
  }

  private count(res: CountedResponse): void {
    // Closed already (its client left while the body was read): 'close' will not come again, and
    // a count taken now would never be given back.
    if (res.destroyed) return;
    this.counter.inFlight += 1;
    res[IN_FLIGHT] = this.counter;
    res.on('close', released);
  }

  /**
   * At arrival: refuses while shedding; counts a request without a body at once and leaves one
   * with a body to `bodyRead`.
   */
  middleware(): RequestHandler {
    return (req, res, next) => {
      const reason = this.shedding();
      if (reason) {
        this.shed(res, reason);
        return;
      }
      if (carriesBody(req)) (res as AdmittedResponse)[AWAITING_BODY] = true;
      else this.count(res);
      next();
    };
  }

  /**
   * After a body reader: counts the request now that its body is here, or refuses it if the cap
   * filled while the body was on the wire. Passes a request already counted (or never admitted
   * here) through, so a route may sit behind more than one body reader.
   */
  bodyRead(): RequestHandler {
    return (_req, res, next) => {
      const admitted = res as AdmittedResponse;
      if (admitted[AWAITING_BODY] !== true) {
        next();
        return;
      }
      admitted[AWAITING_BODY] = false;
      if (this.opts.maxInFlight > 0 && this.counter.inFlight >= this.opts.maxInFlight) {
        this.shed(res, 'in_flight');
        return;
      }
      this.count(admitted);
      next();
    };
  }
}
