// A relay and a consumer started before the operator created their activity's topics (a newcomer
// starting the roles first, or Pods scheduled before warm-up) wait for them, not ready, and start
// once the topics exist, instead of exiting.
import { request } from 'undici';
import { createKafka, ensureTopics, topicsFor } from '../../../core/kafka.js';
import { freshDatabase, testEnv, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';
import { startRole, waitFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';

const TIMEOUT_MS = 120_000;

describe('roles started before their topics exist', () => {
  let db: FreshDatabase;
  const roles: RoleProcess[] = [];

  beforeAll(async () => {
    db = await freshDatabase();
  }, TIMEOUT_MS);

  afterAll(async () => {
    await Promise.all(roles.map((r) => r.kill()));
    await db?.drop();
  }, TIMEOUT_MS);

  const readyz = async (r: RoleProcess): Promise<number> => {
    const res = await request(`${r.url}/readyz`);
    await res.body.dump();
    return res.statusCode;
  };

  it(
    'wait, not ready, and start once the operator has created them',
    async () => {
      const activityId = uniqueId('early');
      for (const role of ['relay', 'consumer']) {
        roles.push(
          await startRole(role, {
            activityId,
            databaseUrl: db.url,
            env: { LOG_LEVEL: 'info' },
            waitReady: false,
          }),
        );
      }
      for (const r of roles) {
        await waitFor(`${r.role} waiting for its topics`, async () => {
          if (r.proc.exitCode !== null)
            throw new Error(`${r.role} exited (${r.proc.exitCode}):\n${r.output()}`);
          return r.output().includes("waiting for the activity's Kafka topics") && (await readyz(r)) === 503;
        });
      }

      const admin = createKafka(testEnv().kafkaBrokers, activityId).admin();
      await admin.connect();
      await ensureTopics(admin, topicsFor(activityId), 2, 1);
      await admin.disconnect();

      for (const r of roles) {
        await waitFor(`${r.role} ready`, async () => {
          if (r.proc.exitCode !== null)
            throw new Error(`${r.role} exited (${r.proc.exitCode}):\n${r.output()}`);
          return (await readyz(r)) === 200;
        });
        expect(r.output()).toContain("the activity's Kafka topics exist; starting");
      }
      for (const r of roles) expect(await r.stop()).toBe(0);
    },
    TIMEOUT_MS,
  );
});
