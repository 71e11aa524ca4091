// A typed call through openapi-fetch on the types openapi-typescript generates from the API's
// description: tests/test_generated_clients.py generates dedup-api.d.ts beside this file and runs
// tsc on it, so a description whose types refuse a run's parameters, or leave out a header an
// answer carries, fails there (docs/dedupctl.md, "Generating a client").
import createClient from "openapi-fetch";
import type { paths } from "./dedup-api";

type ManualRun = paths["/api/v1/jobs/{job_id}/runs"]["post"];
type SlotRun = paths["/api/v1/jobs/{job_id}/executions/{schedule_time}/run"]["post"];

const client = createClient<paths>({ baseUrl: "https://dedup.example.com" });

/** Run a job now with its parameters, once per token; what the answer says, in words. */
export async function runNow(idToken: string, clientToken: string): Promise<string> {
  const { data, error, response } = await client.POST("/api/v1/jobs/{job_id}/runs", {
    params: { path: { job_id: "nightly-report" }, header: { "Idempotency-Key": clientToken } },
    headers: { Authorization: `Bearer ${idToken}` },
    body: { parameters: { rows: 7, region: "eu", dry_run: false, tags: ["month-end"] } },
  });
  if (data !== undefined) {
    const replayed = response.headers.get("Idempotent-Replayed") === "true";
    return `${data.run_id} ${data.status}${replayed ? " (replayed)" : ""}`;
  }
  const retryAfter = response.headers.get("Retry-After");
  return `${response.status} ${"type" in error ? error.title : error.status}${retryAfter ? `, retry in ${retryAfter} s` : ""}`;
}

// The headers each answer carries, as the description types them: a header it did not declare
// would be unknown, and every @ts-expect-error below unused, which tsc refuses.
type Replayed = ManualRun["responses"][200]["headers"];
type Busy = ManualRun["responses"][409]["headers"];
type Failed = ManualRun["responses"][422]["headers"];
export const replayed: Replayed["Idempotent-Replayed"] = "true";
export const token: Replayed["Idempotency-Key"] = "deploy-4711";
export const expires: Replayed["Idempotency-Expires"] = "2026-11-29T07:00:00.000000Z";
export const retryAfter: Busy["Retry-After"] = 30;
export const failedAgain: Failed["Idempotent-Replayed"] = undefined; // sent on a replay only
// @ts-expect-error: only "true" is ever sent
export const notReplayed: Replayed["Idempotent-Replayed"] = "false";
// @ts-expect-error: a client token is a string
export const numericToken: Replayed["Idempotency-Key"] = 4711;
// @ts-expect-error: an expiry is a timestamp
export const numericExpiry: Replayed["Idempotency-Expires"] = 4711;
// @ts-expect-error: Retry-After is a number of seconds
export const soon: Busy["Retry-After"] = "soon";
// @ts-expect-error: a replay is marked "true"
export const slotReplayed: SlotRun["responses"][200]["headers"]["Idempotent-Replayed"] = "yes";
// @ts-expect-error: a busy slot's Retry-After is a number of seconds too
export const slotSoon: SlotRun["responses"][409]["headers"]["Retry-After"] = "soon";
