// Exits 0 once the broker answers a metadata request (used by start-kafka.sh) and, when a second
// argument gives a broker count, once the cluster lists that many brokers.
const { Kafka, logLevel } = require('kafkajs');
const want = Number(process.argv[3] ?? '1');
const kafka = new Kafka({ brokers: [process.argv[2]], logLevel: logLevel.NOTHING, retry: { retries: 0 } });
const admin = kafka.admin();
admin
  .connect()
  .then(() => admin.describeCluster())
  .then((c) => {
    if (c.brokers.length < want) throw new Error(`${c.brokers.length} of ${want} brokers`);
  })
  .then(() => admin.disconnect())
  .then(() => process.exit(0))
  .catch(() => process.exit(1));
