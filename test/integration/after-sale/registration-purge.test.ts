// Buyers' pre-registrations outlive their sale only for REGISTRATION_RETENTION_DAYS: the after-sale
// role deletes those of sales that ended longer ago (runtime/jobs/after-sale.ts
// scheduleRegistrationPurge, core/db/registrations-store.ts purgeEndedRegistrations), never those
// of a sale that ended more recently or has not ended, and 0 keeps every one.
import pg from 'pg';
import { registerActivity } from '../../../core/db/activity-registry-store.js';
import { purgeEndedRegistrations, recordRegistration } from '../../../core/db/registrations-store.js';
import { purgeRegistrations } from '../../../runtime/jobs/after-sale.js';
import { startRole, waitFor } from '../../../dev/roles.js';
import type { RoleProcess } from '../../../dev/roles.js';
import { freshDatabase, uniqueId } from '../../../dev/servers.js';
import type { FreshDatabase } from '../../../dev/servers.js';

const DAY_MS = 86_400_000;

describe('registration retention', () => {
  let db: FreshDatabase;
  let sql: pg.Pool;
  let role: RoleProcess | undefined;

  beforeAll(async () => {
    db = await freshDatabase();
    sql = new pg.Pool({ connectionString: db.url, max: 2 });
  });

  afterAll(async () => {
    await role?.stop();
    await sql?.end();
    await db?.drop();
  });

  /** An activity whose sale ended `endedDaysAgo` days ago (negative: ends in the future), with buyers registered. */
  const saleWithRegistrations = async (endedDaysAgo: number, buyers: number): Promise<string> => {
    const activityId = uniqueId('reg');
    const endAt = new Date(Date.now() - endedDaysAgo * DAY_MS);
    await registerActivity(sql, {
      activityId,
      owner: `shop/${activityId}`,
      ownerUid: `uid-${activityId}`,
      startAt: new Date(endAt.getTime() - 3_600_000),
      endAt,
      requireOrderCode: false,
      reopenOnRelease: false,
    });
    for (let i = 0; i < buyers; i += 1) await recordRegistration(sql, activityId, `u${i}`);
    return activityId;
  };

  const registrations = async (): Promise<Record<string, number>> => {
    const res = await sql.query<{ activity_id: string; n: string }>(
      `SELECT activity_id, count(*) AS n FROM activity_registrations GROUP BY activity_id`,
    );
    return Object.fromEntries(res.rows.map((r) => [r.activity_id, Number(r.n)]));
  };

  test('registrations of sales ended longer ago than the retention go; the others stay; 0 keeps all', async () => {
    const old = await saleWithRegistrations(40, 3);
    const older = await saleWithRegistrations(400, 2);
    const recent = await saleWithRegistrations(1, 4);
    const running = await saleWithRegistrations(-1, 1);
    const before = { [old]: 3, [older]: 2, [recent]: 4, [running]: 1 };
    expect(await registrations()).toEqual(before);

    expect(await purgeRegistrations(sql, 0)).toBe(0);
    expect(await registrations()).toEqual(before);

    // In batches: a call deletes at most `limit`.
    expect(await purgeEndedRegistrations(sql, 30 * 86_400, 2)).toBe(2);
    expect(await purgeRegistrations(sql, 30)).toBe(3);
    expect(await registrations()).toEqual({ [recent]: 4, [running]: 1 });
    expect(await purgeRegistrations(sql, 30)).toBe(0);
  });

  test('the after-sale role deletes them on its reconciliation schedule', async () => {
    const old = await saleWithRegistrations(31, 2);
    const kept = await saleWithRegistrations(29, 2);
    role = await startRole('after-sale', {
      databaseUrl: db.url,
      env: { RECONCILIATION_CRON: '* * * * * *', REGISTRATION_RETENTION_DAYS: '30' },
    });
    await waitFor(
      'the ended sale’s registrations to be purged',
      async () => !(old in (await registrations())),
    );
    expect((await registrations())[kept]).toBe(2);
  });
});
