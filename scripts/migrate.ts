// `node --import tsx scripts/migrate.ts`: applies the pending migrations to $DATABASE_URL (each
// once, under an advisory lock; see core/db/migrate.ts). Used by docs/local-sale.md.
import { migrate } from '../core/db/migrate.js';

const url = process.env.DATABASE_URL;
if (!url) {
  process.stderr.write('DATABASE_URL is not set\n');
  process.exit(2);
}
const applied = await migrate(url);
process.stdout.write(applied.length > 0 ? `applied ${applied.join(', ')}\n` : 'schema up to date\n');
