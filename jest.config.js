// Jest runs TypeScript as ESM (required by @kubernetes/client-node 1.x); see ARCHITECTURE.md.
// Diagnostics stay on: a type error in a test fails that test file. ts-jest type-checks only
// without isolatedModules, and then refuses the hybrid NodeNext module kind, so the transform
// checks with ESNext + Bundler resolution; `tsc --noEmit` (run first by test/run.sh) keeps NodeNext.
const transform = {
  '^.+\\.ts$': [
    'ts-jest',
    {
      useESM: true,
      diagnostics: true,
      tsconfig: {
        isolatedModules: false,
        module: 'ESNext',
        moduleResolution: 'Bundler',
        // jest loads globalSetup as CommonJS; module syntax is tsc --noEmit's job.
        verbatimModuleSyntax: false,
      },
    },
  ],
};
const common = {
  preset: 'ts-jest/presets/default-esm',
  extensionsToTreatAsEsm: ['.ts'],
  testEnvironment: 'node',
  moduleNameMapper: { '^(\\.{1,2}/.*)\\.js$': '$1' },
  transform,
};

/** @type {import('jest').Config} */
export default {
  projects: [
    { ...common, displayName: 'unit', testMatch: ['<rootDir>/test/unit/**/*.test.ts'] },
    {
      ...common,
      displayName: 'integration',
      testMatch: ['<rootDir>/test/integration/**/*.test.ts', '<rootDir>/test/e2e/**/*.test.ts'],
      // The heavy fault scenarios (window 12 failover, window 13 with RESERVE_ACK=replica, window 17 recovery, window 18's cluster failover) belong to `make faults`
      // (FAULT_HEAVY=1), not to the default suite: left out, not reported as skipped.
      testPathIgnorePatterns:
        process.env.FAULT_HEAVY === '1'
          ? ['/node_modules/']
          : [
              '/node_modules/',
              '/test/integration/faults/(failover|recovery|cluster-failover|restore-replica)\\.test\\.ts$',
            ],
      globalSetup: '<rootDir>/test/env/global-setup.ts',
      setupFiles: ['<rootDir>/test/env/pg-idle-errors.ts'],
      globalTeardown: '<rootDir>/test/env/global-teardown.ts',
    },
  ],
  // Integration tests start real processes and wait for real pipelines; unit tests finish in ms.
  testTimeout: 180_000,
  reporters: ['default', '<rootDir>/test/summary-reporter.cjs'],
};
