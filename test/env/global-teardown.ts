// Jest global teardown of the integration project: stops what global-setup.ts started (nothing
// when the servers were given through the environment). Self-contained, like global-setup.ts.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';

interface ProjectConfig {
  rootDir: string;
}

export default function globalTeardown(_globalConfig: unknown, projectConfig: ProjectConfig): void {
  const state = process.env.FLASHSALE_OWNED_STATE;
  if (!state) return;
  if (existsSync(state)) {
    // Quiet: nothing may follow the summary reporter's line.
    spawnSync('bash', [path.join(projectConfig.rootDir, 'test', 'env', 'env-down.sh'), state], {
      stdio: 'ignore',
      timeout: 60_000,
    });
  }
  delete process.env.FLASHSALE_OWNED_STATE;
}
