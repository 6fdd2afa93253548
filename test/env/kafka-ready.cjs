// Exits 0 once the broker answers a metadata request (used by start-kafka.sh).
const { Kafka, logLevel } = require('kafkajs');
const kafka = new Kafka({ brokers: [process.argv[2]], logLevel: logLevel.NOTHING, retry: { retries: 0 } });
const admin = kafka.admin();
admin
  .connect()
  .then(() => admin.describeCluster())
  .then(() => admin.disconnect())
  .then(() => process.exit(0))
  .catch(() => process.exit(1));
