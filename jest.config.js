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
        // Jest loads the global setup/teardown as CommonJS, which verbatimModuleSyntax refuses.
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
      globalSetup: '<rootDir>/test/env/global-setup.ts',
      globalTeardown: '<rootDir>/test/env/global-teardown.ts',
    },
  ],
  // Integration tests start real processes and wait for real pipelines; unit tests finish in ms.
  testTimeout: 180_000,
  reporters: ['default', '<rootDir>/test/summary-reporter.cjs'],
};
