'use strict';
/*
 * Drives the stock RocketMQ 5.x Node.js SDK (npm rocketmq-client-nodejs, pinned in package-lock.json) for
 * raftmq's gRPC interop tests (tests/interop/test_grpc_v2_nodejs.py, through tests/interop/sdk5_nodejs.py).
 * It needs nothing of the repository but this directory's node_modules.
 *
 *     node driver.js produce|consume|push SPEC.json
 *
 * Every command prints one JSON object per line on stdout (what the tests assert on) and the SDK's log on
 * stderr; it exits 0 when it ran to its end, 3 when its deadline (SPEC.deadline_seconds) passed first:
 * the SDK waits forever for a server's first Settings reply, so the driver bounds itself.
 *
 * produce SPEC: {endpoints, access_key, secret_key, topic, messages: [{body, tag, keys: [...], properties:
 *   {...}, message_group, delivery_timestamp_ms, transaction: "commit" | "rollback" | "leave"}],
 *   check_answers: {body: "commit" | "rollback"}, await_checks, await_checks_seconds}
 *   One producer sends every message in order, each transactional one in a transaction of its own resolved
 *   as asked ("leave": neither, for the broker to check back). Lines: {index, ok, message_id,
 *   transaction_id, offset} or {index, ok: false, error, code} per message; {checked, message_id,
 *   transaction_id, topic, answer} per check-back its checker answered (commit unless check_answers says
 *   otherwise); {ended, transaction_id, resolution, source, ok, error} per EndTransaction it sent. With
 *   await_checks it stays up until that many EndTransaction calls of check-backs returned, at most
 *   await_checks_seconds.
 *
 * consume SPEC: {endpoints, access_key, secret_key, topic, group, tag, invisible_ms, await_ms, batch,
 *   deliveries, seconds, no_ack_first: [bodies], change_invisible_first: {body: ms},
 *   ack_after_change: [bodies], never_ack: [bodies]}
 *   One SimpleConsumer receives until `deliveries` messages arrived or `seconds` passed. It acknowledges
 *   each delivery, except: the first delivery of a body in no_ack_first (it comes back after its
 *   invisible time); the first delivery of a body in change_invisible_first, whose invisible time it
 *   changes instead (then acknowledges it at once with the new receipt handle if the body is in
 *   ack_after_change); every delivery of a body in never_ack. A line per delivery: {body, message_id, tag,
 *   keys, properties, attempt, message_group, delivery_timestamp_ms, corrupted, received_ms, acked,
 *   changed, ack_error}; {error} per failed receive.
 *
 * push SPEC: {endpoints, access_key, secret_key, topic, group, tag, deliveries, seconds, linger_seconds}
 *   One PushConsumer (QueryAssignment, auto-renewed receives, acks) consumes every message successfully
 *   until `deliveries` arrived or `seconds` passed, then shuts down (its acks go out). Lines: {fifo}
 *   once started (whether the server's Settings made it a FIFO consumer), then one per delivery: {body,
 *   message_id, tag, keys, properties, attempt, message_group, delivery_timestamp_ms, corrupted}.
 */

const fs = require('node:fs');
const util = require('node:util');
const { ConsumeResult, Producer, PushConsumer, SimpleConsumer } = require('rocketmq-client-nodejs');
const { TransactionResolution, TransactionSource } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

// the SDK's default request timeout is 3 s; two shared cores running a Raft group need more
const REQUEST_TIMEOUT_MS = 10000;
const POLL_MS = 50;

function emit(record) {
  process.stdout.write(JSON.stringify(record) + '\n');
}

// the SDK's log on stderr (its default writes to $HOME/logs/rocketmq/), one line each, debug left out
const logger = {
  info: (...args) => process.stderr.write(`${new Date().toISOString()} INFO ${util.format(...args)}\n`),
  warn: (...args) => process.stderr.write(`${new Date().toISOString()} WARN ${util.format(...args)}\n`),
  error: (...args) => process.stderr.write(`${new Date().toISOString()} ERROR ${util.format(...args)}\n`),
  debug: () => {},
  close: () => {},
};

function describe(error) {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}

function sleep(ms) {
  return new Promise(resolve => setTimeout(resolve, ms));
}

async function until(condition, deadlineMs) {
  while (!condition() && Date.now() < deadlineMs) {
    await sleep(POLL_MS);
  }
}

function clientOptions(spec) {
  const options = { endpoints: spec.endpoints, namespace: '', requestTimeout: REQUEST_TIMEOUT_MS, logger };
  if (spec.access_key) {
    options.sessionCredentials = { accessKey: spec.access_key, accessSecret: spec.secret_key || '' };
  }
  return options;
}

function messageOptions(topic, item) {
  const options = { topic, body: Buffer.from(item.body, 'utf8') };
  if (item.tag) options.tag = item.tag;
  if (item.keys) options.keys = item.keys;
  if (item.properties) options.properties = new Map(Object.entries(item.properties));
  if (item.message_group) options.messageGroup = item.message_group;
  if (item.delivery_timestamp_ms) options.deliveryTimestamp = new Date(item.delivery_timestamp_ms);
  return options;
}

function view(message) {
  return {
    body: message.body.toString('utf8'),
    message_id: message.messageId,
    tag: message.tag || null,
    keys: [ ...message.keys ].sort(),
    properties: Object.fromEntries(message.properties),
    attempt: message.deliveryAttempt ?? null,
    message_group: message.messageGroup || null,
    delivery_timestamp_ms: message.deliveryTimestamp ? message.deliveryTimestamp.getTime() : null,
    corrupted: message.corrupted === true,
  };
}

async function produce(spec) {
  const answers = spec.check_answers || {};
  const serverChecks = [];
  const checker = {
    async check(message) {
      const body = message.body.toString('utf8');
      const answer = answers[body] || 'commit';
      emit({ checked: body, message_id: message.messageId, topic: message.topic, answer });
      return answer === 'rollback' ? TransactionResolution.ROLLBACK : TransactionResolution.COMMIT;
    },
  };
  const producer = new Producer({ ...clientOptions(spec), topics: [ spec.topic ], checker });
  // every EndTransaction the SDK sends, the client's own and a check-back's alike, reported with its outcome
  const endTransaction = producer.endTransaction.bind(producer);
  producer.endTransaction = async (endpoints, message, messageId, transactionId, resolution, source) => {
    const record = { ended: message.body.toString('utf8'), message_id: messageId, transaction_id: transactionId,
      resolution: resolution === TransactionResolution.COMMIT ? 'commit' : 'rollback',
      source: source === TransactionSource.SOURCE_SERVER_CHECK ? 'server_check' : 'client', ok: true, error: null };
    try {
      await endTransaction(endpoints, message, messageId, transactionId, resolution, source);
    } catch (error) {
      record.ok = false;
      record.error = describe(error);
      throw error;
    } finally {
      emit(record);
      if (record.source === 'server_check') serverChecks.push(record);
    }
  };
  await producer.startup();
  try {
    for (const [ index, item ] of spec.messages.entries()) {
      try {
        let receipt;
        if (item.transaction) {
          const transaction = producer.beginTransaction();
          receipt = await producer.send(messageOptions(spec.topic, item), transaction);
          if (item.transaction === 'commit') {
            await transaction.commit();
          } else if (item.transaction === 'rollback') {
            await transaction.rollback();
          }
        } else {
          receipt = await producer.send(messageOptions(spec.topic, item));
        }
        emit({ index, ok: true, message_id: receipt.messageId, transaction_id: receipt.transactionId || null,
          offset: receipt.offset ?? null });
      } catch (error) {
        emit({ index, ok: false, error: describe(error), code: error.code ?? null });
      }
    }
    await until(() => serverChecks.length >= (spec.await_checks || 0),
      Date.now() + (spec.await_checks_seconds || 0) * 1000);
  } finally {
    await producer.shutdown();
  }
}

async function consume(spec) {
  const consumer = new SimpleConsumer({ ...clientOptions(spec), consumerGroup: spec.group,
    subscriptions: new Map([ [ spec.topic, spec.tag || '*' ] ]), awaitDuration: spec.await_ms ?? 2000 });
  await consumer.startup();
  const noAck = new Set(spec.no_ack_first || []);
  const change = new Map(Object.entries(spec.change_invisible_first || {}));
  const ackAfterChange = new Set(spec.ack_after_change || []);
  const never = new Set(spec.never_ack || []);
  const deadline = Date.now() + spec.seconds * 1000;
  let delivered = 0;
  try {
    while (delivered < spec.deliveries && Date.now() < deadline) {
      let messages;
      try {
        messages = await consumer.receive(spec.batch || 16, spec.invisible_ms);
      } catch (error) { // reported; it tries again (a leader may be changing)
        emit({ error: describe(error) });
        await sleep(500);
        continue;
      }
      const receivedMs = Date.now();
      for (const message of messages) {
        const record = { ...view(message), received_ms: receivedMs, acked: false, changed: false, ack_error: null };
        const first = !message.deliveryAttempt || message.deliveryAttempt === 1;
        try {
          if (first && change.has(record.body)) {
            await consumer.changeInvisibleDuration(message, change.get(record.body));
            record.changed = true;
            if (ackAfterChange.has(record.body)) { // with the handle the change returned
              await consumer.ack(message);
              record.acked = true;
            }
          } else if (!(first && noAck.has(record.body)) && !never.has(record.body)) {
            await consumer.ack(message);
            record.acked = true;
          }
        } catch (error) {
          record.ack_error = describe(error);
        }
        emit(record);
        delivered += 1;
      }
    }
  } finally {
    await consumer.shutdown();
  }
}

async function push(spec) {
  let delivered = 0;
  const messageListener = {
    async consume(message) {
      emit(view(message));
      delivered += 1;
      return ConsumeResult.SUCCESS;
    },
  };
  const consumer = new PushConsumer({ ...clientOptions(spec), consumerGroup: spec.group,
    subscriptions: new Map([ [ spec.topic, spec.tag || '*' ] ]), messageListener });
  await consumer.startup();
  // what the server's Settings reply made of it: the FIFO consume service or the standard one
  emit({ fifo: consumer.getPushConsumerSettings().isFifo() });
  try {
    await until(() => delivered >= spec.deliveries, Date.now() + spec.seconds * 1000);
    // anything more would arrive now (a message the filter should have kept out, a redelivery)
    await sleep((spec.linger_seconds ?? 1) * 1000);
  } finally {
    await consumer.shutdown();
  }
}

async function main(argv) {
  const commands = { produce, consume, push };
  if (argv.length !== 2 || !(argv[0] in commands)) {
    process.stderr.write('usage: node driver.js produce|consume|push SPEC.json\n');
    return 2;
  }
  const spec = JSON.parse(fs.readFileSync(argv[1], 'utf8'));
  const deadline = setTimeout(() => {
    emit({ error: `deadline of ${spec.deadline_seconds} s passed` });
    process.exit(3);
  }, (spec.deadline_seconds || 60) * 1000);
  try {
    await commands[argv[0]](spec);
  } finally {
    clearTimeout(deadline);
  }
  return 0;
}

main(process.argv.slice(2)).then(
  code => process.exit(code), // gRPC channels may keep the event loop alive after shutdown
  error => {
    process.stderr.write(`${error && error.stack ? error.stack : error}\n`);
    emit({ error: describe(error) });
    process.exit(1);
  });
