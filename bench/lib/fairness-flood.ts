/**
 * Worker thread of the fairness benchmark: the bots and the address farm, on their own event loop so
 * that generating the flood does not delay the honest buyers' clicks and their measured latency.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { Client, tokenSigner } from './fairness-client.js';

export interface FloodPlan {
  url: string;
  secret: string;
  runId: string;
  bots: number;
  botRate: number;
  farmAccounts: number;
  farmRate: number;
  /** Absolute ms. */
  floodStart: number;
  floodEnd: number;
}

async function flood(p: FloodPlan): Promise<void> {
  const sign = tokenSigner(p.secret);
  const client = new Client(p.url, 512);
  let seq = 0;
  const tasks: Promise<unknown>[] = [];
  // Bots: each account its own address, `botRate` per second, evenly spaced with a random phase.
  for (let b = 0; b < p.bots; b += 1) {
    const account = `bot-${p.runId}-${b}`;
    const token = sign(account);
    const address = `198.18.0.${b + 1}`;
    const phase = Math.random() * (1000 / p.botRate);
    tasks.push(
      (async () => {
        const inflight: Promise<unknown>[] = [];
        for (let t = p.floodStart + phase; t < p.floodEnd; t += 1000 / p.botRate) {
          await client.at(t);
          inflight.push(client.fire('bot', account, token, address, `b${(seq += 1)}`));
        }
        await Promise.all(inflight);
      })(),
    );
  }
  // The farm: one address, many accounts, round robin.
  const farmTokens = Array.from({ length: p.farmAccounts }, (_, i) => sign(`farm-${p.runId}-${i}`));
  tasks.push(
    (async () => {
      const inflight: Promise<unknown>[] = [];
      let i = 0;
      for (let t = p.floodStart; t < p.floodEnd; t += 1000 / p.farmRate) {
        await client.at(t);
        const a = i % p.farmAccounts;
        i += 1;
        inflight.push(
          client.fire('farm', `farm-${p.runId}-${a}`, farmTokens[a]!, '198.19.0.1', `f${(seq += 1)}`),
        );
      }
      await Promise.all(inflight);
    })(),
  );
  await Promise.all(tasks);
  await client.close();
  parentPort?.postMessage({ sent: client.sent, lateSends: client.lateSends });
}

void flood(workerData as FloodPlan);
