// The README's request bodies and the fields a client reads, against the types openapi-typescript
// generates from the gateway's document (./api.ts, written by the test), under `tsc --strict`.
import type { components } from "./api";

type Schemas = components["schemas"];

export const hot: Schemas["PublishRequest"] = { payload: { order_id: 42 }, priority: 8 };
export const later: Schemas["PublishRequest"] = {
  payload: { order_id: 43 },
  priority: "low",
  delay_seconds: 30,
  headers: { tenant: "acme" },
};
export const batch: Schemas["BatchRequest"] = {
  messages: [
    { payload: { order_id: 1 }, priority: 9 },
    { payload: { order_id: 2 }, priority: "critical", headers: { tenant: "acme" } },
  ],
};
export const poll: Schemas["ReceiveRequest"] = { max_messages: 10, wait_seconds: 20 };
export const giveUp: Schemas["ReleaseRequest"] = {
  receipt: "3f9c",
  reason: "bad input",
  dead_letter: true,
};
export const retryLater: Schemas["ReleaseRequest"] = { receipt: "3f9c", delay_seconds: 5 };
export const hurry: Schemas["EscalateRequest"] = { payload: { order_id: 42 }, band: "hot" };
export const acks: Schemas["AckBatchRequest"] = { receipts: ["3f9c", "77ab"] };

export function published(answer: Schemas["PublishedMessage"]): string {
  return `${answer.message_id} in ${answer.band} at ${answer.enqueued_at}`;
}

export function received(answer: Schemas["ReceiveResponse"]): string[] {
  return answer.messages.map(
    (m) => `${m.message_id} ${m.band} ${m.priority} attempt ${m.attempt} ${m.receipt}`,
  );
}

export function outcome(answer: Schemas["ReleaseResponse"]): string {
  if (answer.outcome === "retry") return `retry as attempt ${answer.attempt ?? "?"}`;
  if (answer.outcome === "dead-lettered") return `dead letter: ${answer.reason ?? ""}`;
  return answer.outcome;
}

export function ready(stats: Schemas["QueueStats"]): number {
  return stats.bands.reduce((sum, band) => sum + (band.ready ?? 0), 0);
}

export function deadLetters(list: Schemas["DeadLetters"]): string[] {
  return list.messages.map((d) => `${d.message_id}: ${d.reason ?? d.cause ?? "?"}`);
}

export function failure(answer: Schemas["ErrorResponse"]): string {
  return `${answer.error.code}: ${answer.error.message}`;
}

// What the document refuses must not type-check either.
// @ts-expect-error: a publish needs its payload
export const empty: Schemas["PublishRequest"] = {};
// @ts-expect-error: no such priority name
export const urgent: Schemas["PublishRequest"] = { payload: 1, priority: "urgent" };
