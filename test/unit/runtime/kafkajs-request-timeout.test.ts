// kafkajs 2.2.4 as patched (patches/kafkajs+2.2.4.patch) against upstream, on what a broker that
// stalls does to a client: its TCP connection stays open and nothing is answered. Upstream, the
// connection outlived a timed-out request, so every later request on it waited out its own
// timeout, and a consumer's fetch that timed out was retried against the same broker. Patched, the
// connection closes (the requests still on it fail at once), callers that reconnect it at the
// same time share one socket, and the consumer drops the broker (closing its connections), so the
// next metadata read comes from another. A client begins at a random broker of its bootstrap list
// and leaves a seed whose first request timed out for the next one (upstream, every client began
// at the first, and one that stalled held each for about 5 minutes, then failed), and calls on any
// broker (an admin's metadata read) try connected brokers first; a new connection's ApiVersions
// request keeps the connection timeout it is sent with (upstream the whole request timeout), and an
// idempotent producer asks for its id again when that request timed out (upstream its connect
// failed), and a consumer's fetcher resolves the first offsets of its own partitions only (upstream
// of every partition assigned to the member, so a new group's fetchers all waited on a stalled
// leader). The end-to-end proof with a frozen broker of a real cluster is
// test/integration/faults/stalled-broker.test.ts; the "broker" here is a socket that takes in every
// byte and answers none, the one behaviour under test (the offsets' case fakes the cluster's calls).
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { kafkajsModule } from '../../../bench/lib/patched-packages.js';
import { fixKafkajsIdleLoop } from '../../../core/kafkajs-idle-loop.js';

type Which = 'installed' | 'upstream';

interface KafkaRequest {
  apiKey: number;
}
interface Connection {
  connect(): Promise<boolean>;
  send(protocol: { request: KafkaRequest; response: unknown }): Promise<unknown>;
  isConnected(): boolean;
  disconnect(): Promise<boolean>;
}
type ConnectionClass = new (options: Record<string, unknown>) => Connection;
interface Loggers {
  LEVELS: { NOTHING: number };
  createLogger(options: { level: number; logCreator: () => () => void }): unknown;
}
type ApiVersions = { protocol(v: { version: number }): () => { request: KafkaRequest; response: unknown } };

const REQUEST_TIMEOUT_MS = 300;

/** The error kafkajs (`which`) raises when `request` to the broker at 127.0.0.1:39092 times out. */
const timedOut = (which: Which, request: string): Error => {
  const { KafkaJSRequestTimeoutError } = kafkajsModule<{
    KafkaJSRequestTimeoutError: new (m: string, o: { broker: string }) => Error;
  }>(which, 'src/errors.js');
  return new KafkaJSRequestTimeoutError(`Request ${request} timed out`, { broker: '127.0.0.1:39092' });
};

/** kafkajs' own logger (`which`), set to log nothing. */
const silentLogger = (which: Which): unknown => {
  const loggers = kafkajsModule<Loggers>(which, 'src/loggers/index.js');
  return loggers.createLogger({ level: loggers.LEVELS.NOTHING, logCreator: () => () => undefined });
};

describe('a broker that stops answering (patches/kafkajs+2.2.4.patch)', () => {
  let server: net.Server;
  let port: number;
  const accepted: net.Socket[] = [];

  // As core/kafka.ts does before any client, on both copies (the guard is not what this compares):
  // a request queue a timed-out request left empty then arms no timer with a negative delay (Node's
  // TimeoutNegativeWarning on the run's output otherwise).
  beforeAll(() => {
    for (const which of ['installed', 'upstream'] as const)
      expect(
        fixKafkajsIdleLoop(kafkajsModule<{ prototype: object }>(which, 'src/network/requestQueue/index.js')),
      ).toBe(true);
  });

  beforeAll(async () => {
    // Reads and ignores every request: a stalled broker as a client sees one.
    server = net.createServer((socket) => {
      accepted.push(socket);
      socket.on('data', () => undefined);
      socket.on('error', () => undefined);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as AddressInfo).port;
  });

  afterAll(async () => {
    for (const s of accepted) s.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });

  const open = (which: Which, requestTimeout = REQUEST_TIMEOUT_MS): Connection => {
    const Connection = kafkajsModule<ConnectionClass>(which, 'src/network/connection.js');
    const socketFactory = kafkajsModule<() => unknown>(which, 'src/network/socketFactory.js');
    return new Connection({
      host: '127.0.0.1',
      port,
      logger: silentLogger(which),
      socketFactory: socketFactory(),
      requestTimeout,
      connectionTimeout: 1_000,
    });
  };
  const apiVersions = (which: Which): { request: KafkaRequest; response: unknown } =>
    kafkajsModule<ApiVersions>(which, 'src/protocol/requests/apiVersions/index.js').protocol({
      version: 0,
    })();
  /** How a request failed: its error's name and message. */
  const outcome = (p: Promise<unknown>): Promise<string> =>
    p.then(
      () => 'answered',
      (e: Error) => `${e.name}: ${e.message}`,
    );
  const ON_CLOSE =
    /^KafkaJSRequestTimeoutError: Request not answered: another request on its connection timed out/;
  const OWN_TIMEOUT = /^KafkaJSRequestTimeoutError: Request ApiVersions\(key: 18, version: 0\) timed out$/;

  /** Two requests, the second sent half a timeout after the first. */
  const twoRequests = async (which: Which) => {
    const connection = open(which);
    await connection.connect();
    const first = outcome(connection.send(apiVersions(which)));
    await new Promise((r) => setTimeout(r, REQUEST_TIMEOUT_MS / 2));
    const second = outcome(connection.send(apiVersions(which)));
    const [a, b] = await Promise.all([first, second]);
    const connectedAfter = connection.isConnected();
    await connection.disconnect();
    return { first: a, second: b, connectedAfter };
  };

  // The second request's message says why it failed: the connection closed under it when the
  // first timed out (patched) or its own timeout ran out (upstream). Either way the error is the
  // one callers already retry a timed-out request on.
  it('patched: the first timeout closes the connection and fails the request still on it at once', async () => {
    const r = await twoRequests('installed');
    expect(r.first).toMatch(OWN_TIMEOUT);
    expect(r.second).toMatch(ON_CLOSE);
    expect(r.connectedAfter).toBe(false);
  });

  it('patched: the connection remembers when a request on it timed out (the broker pool tries it last)', async () => {
    const connection = open('installed') as Connection & { requestTimedOutAt?: number };
    await connection.connect();
    const before = Date.now();
    expect(await outcome(connection.send(apiVersions('installed')))).toMatch(OWN_TIMEOUT);
    expect(connection.requestTimedOutAt).toBeGreaterThanOrEqual(before);
    await connection.disconnect();
  });

  it('upstream: the connection stays open and each request waits out its own timeout', async () => {
    const r = await twoRequests('upstream');
    expect(r.first).toMatch(OWN_TIMEOUT);
    expect(r.second).toMatch(OWN_TIMEOUT);
    expect(r.connectedAfter).toBe(true);
  });

  it('a new request after the close opens a new connection', async () => {
    const connection = open('installed');
    await connection.connect();
    const before = accepted.length;
    expect(await outcome(connection.send(apiVersions('installed')))).toMatch(OWN_TIMEOUT);
    expect(connection.isConnected()).toBe(false);
    await connection.connect();
    expect(connection.isConnected()).toBe(true);
    expect(accepted.length).toBe(before + 1);
    await connection.disconnect();
  });

  /** Sockets the server accepted while `connect()` was called twice at once on a closed connection. */
  const concurrentConnects = async (which: Which) => {
    const connection = open(which);
    const before = accepted.length;
    await Promise.all([connection.connect(), connection.connect()]);
    // Let the server side see every socket that was opened.
    await new Promise((r) => setTimeout(r, 100));
    const opened = accepted.length - before;
    await connection.disconnect();
    return opened;
  };

  // A send retried through ConnectionPool.getConnection while a Broker.connect reconnects: both
  // find the connection closed. Upstream each opens a socket and the first is left open, out of
  // reach of disconnect(); the close on a timeout made that race common.
  it('patched: callers connecting at once share one socket', async () => {
    expect(await concurrentConnects('installed')).toBe(1);
  });

  it('upstream: each opens its own, one of them left behind', async () => {
    expect(await concurrentConnects('upstream')).toBe(2);
  });

  describe("the consumer, on a timeout from the group's coordinator (a heartbeat, a commit)", () => {
    interface RunnerInstance {
      running: boolean;
      fetchManager: { start(): Promise<void>; stop(): Promise<void> };
      scheduleFetchManager(): void;
    }
    type RunnerClass = new (options: Record<string, unknown>) => RunnerInstance;
    /** One round of the runner whose fetch manager fails with a coordinator's timeout, then stops. */
    const round = async (which: Which) => {
      const Runner = kafkajsModule<RunnerClass>(which, 'src/consumer/runner.js');
      const removed: unknown[] = [];
      let joins = 0;
      let crashed: string | undefined;
      const consumerGroup: { stalledCoordinator?: { address: string } } & Record<string, unknown> = {
        groupId: 'g',
        memberId: 'm',
        sessionTimeout: 8_000,
        cluster: { removeBroker: (b: unknown) => removed.push(b) },
        joinAndSync: async () => {
          joins += 1;
        },
        getNodeIds: () => [],
      };
      const runner = new Runner({
        logger: silentLogger(which),
        consumerGroup,
        eachBatch: async () => undefined,
        heartbeatInterval: 1_000,
        onCrash: (e: Error) => {
          crashed = e.name;
        },
        retry: { retries: 0 },
      });
      let starts = 0;
      let stopped = (): void => undefined;
      const done = new Promise<void>((resolve) => {
        stopped = resolve;
      });
      runner.fetchManager = {
        start: async () => {
          starts += 1;
          if (starts === 1) throw timedOut(which, 'Heartbeat(key: 12, version: 3)');
          runner.running = false;
          stopped();
        },
        stop: async () => undefined,
      };
      const crash = setInterval(() => {
        if (crashed !== undefined) stopped();
      }, 10);
      runner.running = true;
      runner.scheduleFetchManager();
      await done;
      clearInterval(crash);
      return { removed, joins, crashed, stalled: consumerGroup.stalledCoordinator?.address };
    };

    it('patched: drops the broker, finds the coordinator again (not that broker) and re-joins', async () => {
      expect(await round('installed')).toEqual({
        removed: [{ host: '127.0.0.1', port: 39092 }],
        joins: 1,
        crashed: undefined,
        stalled: '127.0.0.1:39092',
      });
    });

    it('upstream: keeps the coordinator it had (here, with no retries left, the consumer gives up)', async () => {
      expect(await round('upstream')).toEqual({
        removed: [],
        joins: 0,
        crashed: 'KafkaJSNumberOfRetriesExceeded',
        stalled: undefined,
      });
    });
  });

  describe('the broker pool, dropping a broker', () => {
    interface BrokerPoolProto {
      removeBroker(this: unknown, address: { host: string; port: number }): void;
    }
    const drop = (which: Which) => {
      const proto = kafkajsModule<{ prototype: BrokerPoolProto }>(
        which,
        'src/cluster/brokerPool.js',
      ).prototype;
      let disconnects = 0;
      const frozen = {
        nodeId: 1,
        connectionPool: { host: '127.0.0.1', port: 39092 },
        disconnect: async () => {
          disconnects += 1;
        },
      };
      const pool = {
        brokers: { 1: frozen, 2: { nodeId: 2, connectionPool: { host: '127.0.0.1', port: 39093 } } },
        seedBroker: { nodeId: 2 },
        metadataExpireAt: Date.now() + 60_000,
      };
      proto.removeBroker.call(pool, { host: '127.0.0.1', port: 39092 });
      return { left: Object.keys(pool.brokers), metadataExpireAt: pool.metadataExpireAt, disconnects };
    };

    it('patched: closes its connections (nothing else would once it is out of the pool)', () => {
      expect(drop('installed')).toEqual({ left: ['2'], metadataExpireAt: null, disconnects: 1 });
    });

    it('upstream: leaves them open', () => {
      expect(drop('upstream')).toEqual({ left: ['2'], metadataExpireAt: null, disconnects: 0 });
    });
  });

  describe("a new connection's ApiVersions request (Broker.connect's handshake)", () => {
    /** How long an ApiVersions request sent with a 100 ms timeout of its own waits, on a connection whose request timeout is 2 s. */
    const waited = async (which: Which): Promise<number> => {
      const connection = open(which, 2_000);
      await connection.connect();
      const started = Date.now();
      const ended = await outcome(connection.send({ ...apiVersions(which), requestTimeout: 100 } as never));
      const ms = Date.now() - started;
      await connection.disconnect();
      expect(ended).toMatch(OWN_TIMEOUT);
      return ms;
    };

    // Broker.apiVersions sends it with the connection timeout (its lock's timeout assumes so).
    it('patched: keeps its own timeout, shorter than the request timeout', async () => {
      expect(await waited('installed')).toBeLessThan(1_500);
    });

    it('upstream: waits the whole request timeout (a longer one of its own would win; a shorter one never does)', async () => {
      expect(await waited('upstream')).toBeGreaterThanOrEqual(2_000);
    });
  });

  describe("a client's first connect, its first bootstrap broker stalled", () => {
    interface BrokerPoolProto {
      connect(this: unknown): Promise<void>;
    }
    type CreateRetry = (options: { retries: number; initialRetryTime: number }) => unknown;
    /** The seed brokers a pool's connect tried, in order, and how the connect ended. */
    const connect = async (which: Which) => {
      const proto = kafkajsModule<{ prototype: BrokerPoolProto }>(
        which,
        'src/cluster/brokerPool.js',
      ).prototype;
      const createRetry = kafkajsModule<CreateRetry>(which, 'src/retry/index.js');
      const tried: number[] = [];
      // The bootstrap list's first broker takes the connection and answers nothing (its
      // ApiVersions request times out); the second answers.
      const seed = (i: number) => ({
        versions: { answered: i },
        connect: async () => {
          tried.push(i);
          if (i === 0) throw timedOut(which, 'ApiVersions(key: 18, version: 2)');
        },
      });
      let next = 0;
      const pool = {
        seedBroker: seed(next),
        hasConnectedBrokers: () => false,
        createSeedBroker: async () => {
          next = (next + 1) % 2;
          pool.seedBroker = seed(next);
        },
        retrier: createRetry({ retries: 3, initialRetryTime: 1 }),
        logger: { error: () => undefined },
        versions: undefined as unknown,
      };
      const ended = await proto.connect.call(pool).then(
        () => 'connected',
        (e: Error) => e.name,
      );
      return { tried, ended, versions: pool.versions };
    };

    it('patched: a seed whose ApiVersions timed out is left for the next broker of the list', async () => {
      expect(await connect('installed')).toEqual({
        tried: [0, 1],
        ended: 'connected',
        versions: { answered: 1 },
      });
    });

    it('upstream: every retry goes back to the stalled seed until the retries are spent', async () => {
      expect(await connect('upstream')).toEqual({
        tried: [0, 0, 0, 0],
        ended: 'KafkaJSNumberOfRetriesExceeded',
        versions: undefined,
      });
    });
  });

  describe("a client's first bootstrap broker", () => {
    type Builder = (options: Record<string, unknown>) => { build(): Promise<{ port: number }> };
    /** The bootstrap broker each of 60 clients (one builder each) tries first. */
    const firstPorts = async (which: Which): Promise<Set<number>> => {
      const builder = kafkajsModule<Builder>(which, 'src/cluster/connectionPoolBuilder.js');
      const logger = silentLogger(which);
      const first = new Set<number>();
      for (let i = 0; i < 60; i += 1) {
        const b = builder({ brokers: ['127.0.0.1:39092', '127.0.0.1:39093', '127.0.0.1:39094'], logger });
        first.add((await b.build()).port);
      }
      return first;
    };

    it('patched: a random one of the list (each client then goes round the list from it)', async () => {
      // 60 clients all beginning at the same one by chance: 3 × (1/3)^60.
      expect([...(await firstPorts('installed'))].sort()).toEqual([39092, 39093, 39094]);
    });

    it('upstream: always the first of the list', async () => {
      expect([...(await firstPorts('upstream'))]).toEqual([39092]);
    });
  });

  describe("an idempotent producer's InitProducerId request that timed out", () => {
    type CreateEosManager = (options: Record<string, unknown>) => {
      initProducerId(): Promise<void>;
      getProducerId(): number;
    };
    /** The brokers asked, the metadata reads forced, and how the producer's id request ended. */
    const init = async (which: Which) => {
      const createEosManager = kafkajsModule<CreateEosManager>(which, 'src/producer/eosManager/index.js');
      const asked: number[] = [];
      let reads = 0;
      // The metadata names broker 1 as the controller until it is read again; broker 1 stalls.
      let controller = 1;
      const cluster = {
        retry: { retries: 3, initialRetryTime: 1 },
        refreshMetadataIfNecessary: async () => undefined,
        refreshMetadata: async () => {
          reads += 1;
          controller = 2;
        },
        findControllerBroker: async () => {
          const nodeId = controller;
          return {
            initProducerId: async () => {
              asked.push(nodeId);
              if (nodeId === 1) throw timedOut(which, 'InitProducerId(key: 22, version: 1)');
              return { producerId: 42, producerEpoch: 0 };
            },
          };
        },
      };
      const eos = createEosManager({
        logger: silentLogger(which),
        cluster,
        transactional: false,
      });
      const ended = await eos.initProducerId().then(
        () => `producer id ${eos.getProducerId()}`,
        (e: Error) => e.name,
      );
      return { asked, reads, ended };
    };

    it('patched: reads the metadata again and asks the broker it then names', async () => {
      expect(await init('installed')).toEqual({ asked: [1, 2], reads: 1, ended: 'producer id 42' });
    });

    it('upstream: gives up at once (the producer cannot connect)', async () => {
      expect(await init('upstream')).toEqual({ asked: [1], reads: 0, ended: 'KafkaJSRequestTimeoutError' });
    });
  });

  describe("the broker pool's calls on any broker (an admin's metadata read, a producer's)", () => {
    interface BrokerPoolProto {
      withBroker(this: unknown, callback: (b: { nodeId: string }) => Promise<string>): Promise<string>;
      findConnectedBroker(this: unknown): Promise<{ id: string }>;
    }
    interface FakeBroker {
      id: string;
      isConnected(): boolean;
      connectionPool: { lastRequestTimeoutAt(): number };
    }
    /**
     * A broker pool of kafkajs (`which`) over brokers 1–3: `connected` lists those with an open
     * connection, `timedOut` those whose request timed out a second ago. Finding an unconnected
     * broker connects it.
     */
    const pool = (which: Which, connected: string[], timedOut: string[] = []) => {
      const proto = kafkajsModule<{ prototype: BrokerPoolProto }>(
        which,
        'src/cluster/brokerPool.js',
      ).prototype;
      const open = new Set(connected);
      const broker = (id: string): FakeBroker => ({
        id,
        isConnected: () => open.has(id),
        connectionPool: { lastRequestTimeoutAt: () => (timedOut.includes(id) ? Date.now() - 1_000 : 0) },
      });
      const brokers: Record<string, FakeBroker> = { 1: broker('1'), 2: broker('2'), 3: broker('3') };
      const connects: string[] = [];
      const self: unknown = Object.assign(Object.create(proto) as object, {
        brokers,
        findBroker: async ({ nodeId }: { nodeId: string }) => {
          if (!open.has(nodeId)) {
            connects.push(nodeId);
            open.add(nodeId);
          }
          return brokers[nodeId];
        },
      });
      return { proto, self, connects };
    };
    /** The broker each of 40 calls tried first. */
    const firstTried = async (which: Which, connected: string[], timedOut: string[] = []) => {
      const first = new Set<string>();
      for (let i = 0; i < 40; i += 1) {
        const p = pool(which, connected, timedOut);
        first.add(await p.proto.withBroker.call(p.self, async ({ nodeId }) => nodeId));
      }
      return [...first].sort();
    };
    /** The brokers 40 metadata reads were sent to, and the brokers connected for them. */
    const metadataBrokers = async (which: Which, connected: string[], timedOut: string[] = []) => {
      const read = new Set<string>();
      const connects = new Set<string>();
      for (let i = 0; i < 40; i += 1) {
        const p = pool(which, connected, timedOut);
        read.add((await p.proto.findConnectedBroker.call(p.self)).id);
        for (const c of p.connects) connects.add(c);
      }
      return { read: [...read].sort(), connects: [...connects].sort() };
    };

    // Broker 1's connection was closed by a timeout.
    it('patched: connected brokers first, so a broker whose request timed out comes last', async () => {
      expect(await firstTried('installed', ['2', '3'])).toEqual(['2', '3']);
    });

    it('upstream: any broker first, the stalled one too (each time a timeout waited out)', async () => {
      // 40 calls all missing broker 1 by chance: (2/3)^40, about 1 in 11 million.
      expect(await firstTried('upstream', ['2', '3'])).toEqual(['1', '2', '3']);
    });

    // Broker 1's request timed out, and a send retried to its partitions connected it again;
    // broker 2 is not connected.
    it('patched: a broker whose request timed out lately comes after the others, even connected', async () => {
      expect(await firstTried('installed', ['1', '3'], ['1'])).toEqual(['3']);
      expect(await metadataBrokers('installed', ['1', '3'], ['1'])).toEqual({ read: ['3'], connects: [] });
      // The only connected broker is that one: another is connected for the read.
      expect(await metadataBrokers('installed', ['1'], ['1'])).toEqual({
        read: ['2', '3'],
        connects: ['2', '3'],
      });
    });

    it('upstream: any connected broker reads the metadata, the stalled one too', async () => {
      expect(await metadataBrokers('upstream', ['1', '3'], ['1'])).toEqual({
        read: ['1', '3'],
        connects: [],
      });
      expect(await metadataBrokers('upstream', ['1'], ['1'])).toEqual({ read: ['1'], connects: [] });
    });
  });

  describe("the consumer, re-joining after its coordinator's request timed out", () => {
    interface ConsumerGroupProto {
      awaitCoordinatorMoved(this: unknown): Promise<void>;
    }
    /** The lookups made before the join, the coordinator named `movesAfter` lookups after the timeout. */
    const rejoin = async (movesAfter: number, untilMs = 5_000) => {
      const proto = kafkajsModule<{ prototype: ConsumerGroupProto }>(
        'installed',
        'src/consumer/consumerGroup.js',
      ).prototype;
      let lookups = 0;
      const group = {
        groupId: 'g',
        stalledCoordinator: { address: '127.0.0.1:39092', until: Date.now() + untilMs },
        logger: { debug: () => undefined },
        cluster: {
          findGroupCoordinatorMetadata: async () => {
            lookups += 1;
            return {
              coordinator: { nodeId: 1, host: '127.0.0.1', port: lookups > movesAfter ? 39093 : 39092 },
            };
          },
        },
      };
      const t0 = Date.now();
      await proto.awaitCoordinatorMoved.call(group);
      return { lookups, ms: Date.now() - t0, left: group.stalledCoordinator };
    };

    it('patched: asks again while the lookup names the broker that stopped answering', async () => {
      const r = await rejoin(2);
      expect(r.lookups).toBe(3);
      expect(r.left).toBeNull();
    });

    it('patched: gives up waiting after its bound (the session timeout) and joins whatever is named', async () => {
      const r = await rejoin(Number.MAX_SAFE_INTEGER, 400);
      expect(r.ms).toBeGreaterThanOrEqual(400);
      expect(r.ms).toBeLessThan(5_000);
      expect(r.left).toBeNull();
    });

    it('upstream has no such wait: the JoinGroup goes to the broker the first lookup names', () => {
      const proto = kafkajsModule<{ prototype: Partial<ConsumerGroupProto> }>(
        'upstream',
        'src/consumer/consumerGroup.js',
      ).prototype;
      expect(proto.awaitCoordinatorMoved).toBeUndefined();
    });
  });

  describe('the consumer, on a fetch that timed out', () => {
    interface ConsumerGroupProto {
      recoverFromFetch(this: unknown, e: Error): Promise<void>;
    }
    /** The fetch from 127.0.0.1:39092 timed out; the group's coordinator is at `coordinator`. */
    const recover = async (which: Which, coordinator = '127.0.0.1:39093') => {
      const proto = kafkajsModule<{ prototype: ConsumerGroupProto }>(
        which,
        'src/consumer/consumerGroup.js',
      ).prototype;
      const removed: unknown[] = [];
      let joins = 0;
      const group: { stalledCoordinator?: { address: string } } & Record<string, unknown> = {
        groupId: 'g',
        memberId: 'm',
        sessionTimeout: 8_000,
        coordinator: { brokerAddress: coordinator },
        cluster: { removeBroker: (b: unknown) => removed.push(b) },
        logger: { debug: () => undefined, warn: () => undefined, error: () => undefined },
        joinAndSync: async () => {
          joins += 1;
        },
      };
      const error = await proto.recoverFromFetch
        .call(group, timedOut(which, 'Fetch(key: 1, version: 11)'))
        .then(
          () => undefined,
          (e: Error) => e.name,
        );
      return { error, removed, joins, stalled: group.stalledCoordinator?.address };
    };

    it('patched: drops the broker (metadata is read afresh from another) and goes on', async () => {
      expect(await recover('installed')).toEqual({
        error: undefined,
        removed: [{ host: '127.0.0.1', port: 39092 }],
        joins: 0,
        stalled: undefined,
      });
    });

    it('patched: a broker that is also the coordinator is left at once (the group re-joined)', async () => {
      expect(await recover('installed', '127.0.0.1:39092')).toEqual({
        error: undefined,
        removed: [{ host: '127.0.0.1', port: 39092 }],
        joins: 1,
        stalled: '127.0.0.1:39092',
      });
    });

    it('upstream: rethrows, and the retry fetches from the same broker (the coordinator too)', async () => {
      expect(await recover('upstream')).toEqual({
        error: 'KafkaJSRequestTimeoutError',
        removed: [],
        joins: 0,
        stalled: undefined,
      });
      expect(await recover('upstream', '127.0.0.1:39092')).toEqual({
        error: 'KafkaJSRequestTimeoutError',
        removed: [],
        joins: 0,
        stalled: undefined,
      });
    });
  });

  describe("a new group's first fetch from each broker (no committed offsets yet)", () => {
    interface ConsumerGroupProto {
      seekOffsets(this: unknown, topicPartitions: { topic: string; partitions: number[] }[]): Promise<void>;
    }
    type OffsetManagerClass = new (options: Record<string, unknown>) => {
      committedOffsets(): Record<string, Record<string, string>>;
    };
    /**
     * The first fetch of the fetcher of the broker that leads partition 1, for a member assigned
     * partitions 0, 1 and 2 of `orders`. Partition 0's leader has stopped answering: a `ListOffsets`
     * that names it never settles. Returns the partitions each `ListOffsets` asked for, and whether
     * the fetcher got past its offsets within 200 ms (a fetcher that cannot fetch sends no heartbeat).
     */
    const firstFetch = async (which: Which) => {
      const OffsetManager = kafkajsModule<OffsetManagerClass>(which, 'src/consumer/offsetManager/index.js');
      const proto = kafkajsModule<{ prototype: ConsumerGroupProto }>(
        which,
        'src/consumer/consumerGroup.js',
      ).prototype;
      const store: Record<string, Record<string, string>> = {};
      const listOffsets: number[][] = [];
      type Partitions = { topic: string; partitions: { partition: number }[] }[];
      const cluster = {
        committedOffsets: () => store,
        fetchTopicsOffset: (topics: Partitions) => {
          const asked = topics.flatMap((t) => t.partitions.map((p) => p.partition));
          listOffsets.push(asked);
          if (asked.includes(0)) return new Promise(() => undefined);
          return Promise.resolve(
            topics.map((t) => ({
              topic: t.topic,
              partitions: t.partitions.map((p) => ({ ...p, offset: '0' })),
            })),
          );
        },
      };
      const coordinator = {
        isConnected: () => true,
        // A new group: no committed offset for any partition.
        offsetFetch: async ({ topics }: { topics: Partitions }) => ({
          responses: topics.map((t) => ({
            topic: t.topic,
            partitions: t.partitions.map((p) => ({ ...p, offset: '-1' })),
          })),
        }),
      };
      const offsetManager = new OffsetManager({
        cluster,
        coordinator,
        memberAssignment: { orders: [0, 1, 2] },
        topicConfigurations: { orders: { fromBeginning: true } },
        instrumentationEmitter: { emit: () => undefined },
        groupId: 'g',
        generationId: 1,
        memberId: 'm',
        autoCommit: true,
      });
      const group = { seekOffset: { pop: () => undefined }, offsetManager, logger: silentLogger(which) };
      const resolved = await Promise.race([
        proto.seekOffsets.call(group, [{ topic: 'orders', partitions: [1] }]).then(() => true),
        new Promise<boolean>((r) => setTimeout(() => r(false), 200)),
      ]);
      return { listOffsets, resolved, committed: offsetManager.committedOffsets().orders };
    };

    it("patched: resolves only the fetcher's own partitions, so a stalled leader holds only its own fetcher", async () => {
      expect(await firstFetch('installed')).toEqual({
        listOffsets: [[1]],
        resolved: true,
        committed: { 1: '0' },
      });
    });

    it("upstream: every fetcher resolves every assigned partition and waits on the stalled leader's", async () => {
      expect(await firstFetch('upstream')).toEqual({
        listOffsets: [[0, 1, 2]],
        resolved: false,
        committed: {},
      });
    });
  });

  describe('a join whose SyncGroup the coordinator cannot serve yet', () => {
    interface ConsumerGroupProto {
      joinAndSync(this: unknown): Promise<void>;
    }
    /**
     * A group join whose first SyncGroup is answered `GROUP_COORDINATOR_NOT_AVAILABLE` (Kafka's answer
     * when it cannot write the group's assignment, e.g. while a stalled broker is still an in-sync
     * replica of the group's offsets partition), the next ones served. Returns how it ended and the
     * member id each JoinGroup was sent with.
     */
    const join = async (which: Which) => {
      const proto = kafkajsModule<{ prototype: ConsumerGroupProto & object }>(
        which,
        'src/consumer/consumerGroup.js',
      ).prototype;
      const createRetry = kafkajsModule<(o: object) => unknown>(which, 'src/retry/index.js');
      const { createErrorFromCode } = kafkajsModule<{ createErrorFromCode(code: number): Error }>(
        which,
        'src/protocol/error.js',
      );
      const symbol = (name: string) =>
        Object.getOwnPropertySymbols(proto).find((s) => s.description === `private:ConsumerGroup:${name}`)!;
      const joinedAs: string[] = [];
      let syncs = 0;
      const group: Record<string | symbol, unknown> = Object.create(proto);
      Object.assign(group, {
        groupId: 'g',
        memberId: null,
        retrier: createRetry({ retries: 3, initialRetryTime: 10 }),
        subscriptionState: { assigned: () => [{ topic: 'orders', partitions: [0] }] },
        instrumentationEmitter: { emit: () => undefined },
        logger: silentLogger(which),
      });
      group[symbol('join')] = async () => {
        joinedAs.push(String(group.memberId ?? ''));
        group.memberId = group.memberId ?? 'member-1';
      };
      group[symbol('sync')] = async () => {
        syncs += 1;
        if (syncs === 1) throw createErrorFromCode(15);
      };
      const error = await proto.joinAndSync.call(group).then(
        () => undefined,
        (e: Error) => e.message,
      );
      return { error, joinedAs };
    };

    it('patched: joins again as the same member (no second member for the group to wait on)', async () => {
      expect(await join('installed')).toEqual({ error: undefined, joinedAs: ['', 'member-1'] });
    });

    it('upstream: gives up (the consumer crashes and restarts as a new member)', async () => {
      expect(await join('upstream')).toEqual({
        error: 'The group coordinator is not available',
        joinedAs: [''],
      });
    });
  });
});
