// A bandgate worker over HTTP in plain Node, 18 or later (global fetch; no npm packages). Env:
// BANDGATE_GATEWAY_URL, BANDGATE_TOKEN, QUEUE, VISIBILITY_TIMEOUT (seconds a receive leases for).
// Prints one JSON line per message settled: {id, band, priority, attempt, sku, qty, action}.
const { BANDGATE_GATEWAY_URL: url = 'http://127.0.0.1:8000', QUEUE = 'orders' } = process.env;
const base = `${url}/v1/queues/${encodeURIComponent(QUEUE)}`;
const headers = { 'content-type': 'application/json' };
if (process.env.BANDGATE_TOKEN) headers.authorization = `Bearer ${process.env.BANDGATE_TOKEN}`;
const visibility = Number(process.env.VISIBILITY_TIMEOUT ?? 30);
const stopping = new AbortController();
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => stopping.abort());
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const warn = (error) => console.error(error.message);

async function call(path, body, signal) {
  const init = { method: 'POST', headers, body: JSON.stringify(body), signal };
  const response = await fetch(`${base}/${path}`, init);
  const data = await response.json();
  const failure = new Error(`${path}: ${data.error?.code}: ${data.error?.message}`);
  if (!response.ok) throw Object.assign(failure, { code: data.error?.code });
  return data;
}

async function work(messages) {
  const held = new Set(messages.map((m) => m.receipt)); // leased to us, not settled yet
  // Handling may outlast the lease: every 2/3 of it, extend what is still in hand.
  const extend = (receipt) => call('receipts/extend', { receipt, visibility_timeout: visibility });
  const keepalive = setInterval(() => held.forEach((r) => extend(r).catch(warn)), visibility * 667);
  try {
    for (const message of messages) { // in the order received: hottest band first
      const { sku, qty, fail, poison, ms = 0 } = message.payload ?? {};
      await sleep(ms); // the work itself: fill the order
      let action = 'ack';
      if (fail || poison) { // fail: retried with back-off, dead-lettered after max_attempts
        held.delete(message.receipt);
        const reason = poison ? 'unreadable order' : `out of stock: ${sku}`;
        const release = { receipt: message.receipt, reason, dead_letter: Boolean(poison) };
        action = (await call('receipts/release', release)).outcome; // retry | dead-lettered
      }
      const { message_id: id, band, priority, attempt } = message;
      console.log(JSON.stringify({ id, band, priority, attempt, sku, qty, action }));
    }
  } finally { clearInterval(keepalive); }
  return [...held]; // to ack, with the next receive
}

const report = (failed, skip) => failed.filter(({ error }) => error.code !== skip)
  .forEach(({ receipt, error }) => console.error(`ack ${receipt}: ${error.code}`));

// Each receive first acks the batch before it: one request per batch. SIGTERM cuts a long
// poll short (the gateway sees the client go and gives back anything it leased for it) but
// lets the batch in hand finish; its receipts are acked in one last request.
const receive = { max_messages: 10, wait_seconds: 20, visibility_timeout: visibility };
let done = []; // handled, not acked yet
const ackedFirst = new Set(['too_many_leases', 'too_many_receives', 'broker_unavailable']);
while (!stopping.signal.aborted) {
  try {
    const answer = await call('receive', { ...receive, ack: done }, stopping.signal);
    done = [];
    report(answer.ack.failed);
    done = await work(answer.messages);
  } catch (error) {
    if (error.name === 'AbortError') break; // SIGTERM while polling
    if (ackedFirst.has(error.code)) done = []; // the receive acked them, then refused
    warn(error);
    await sleep(1000); // the gateway is down or refused us: do not spin
  }
}
// A poll cut short may have acked them already: lease_expired then says so.
if (done.length) report((await call('receipts/ack', { receipts: done })).failed, 'lease_expired');
