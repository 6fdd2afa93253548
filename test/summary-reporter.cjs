// Prints one plain closing line ("Summary: N passed, N failed, N skipped") that any CI can read,
// after jest's own summary.
class SummaryReporter {
  onRunComplete(_contexts, results) {
    const { numPassedTests: passed, numFailedTests: failed, numPendingTests: skipped } = results;
    const suiteErrors = results.numRuntimeErrorTestSuites;
    const failedTotal = failed + suiteErrors;
    process.stdout.write(`\nSummary: ${passed} passed, ${failedTotal} failed, ${skipped} skipped\n`);
  }
}
module.exports = SummaryReporter;
