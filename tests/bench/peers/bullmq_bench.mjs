// BullMQ's side of tests/bench/bench_peers.py, on the bench's private redis-server:
//   node bullmq_bench.mjs add PORT N            enqueue N jobs of one INCR (addBulk by 1,000)
//   node bullmq_bench.mjs work PORT CONCURRENCY  a worker: each job INCRs bench:incr
import { Queue, Worker } from "bullmq";
import IORedis from "ioredis";

const [mode, port, count] = process.argv.slice(2);
const connection = { host: "127.0.0.1", port: Number(port), maxRetriesPerRequest: null };

if (mode === "add") {
  const queue = new Queue("bench", { connection });
  const n = Number(count);
  for (let start = 0; start < n; start += 1000) {
    const jobs = [];
    for (let i = start; i < Math.min(n, start + 1000); i++) {
      jobs.push({ name: "incr", data: { n: i } });
    }
    await queue.addBulk(jobs);
  }
  await queue.close();
} else {
  const redis = new IORedis(connection);
  const worker = new Worker("bench", async () => redis.incr("bench:incr"),
                            { connection, concurrency: Number(count) });
  const stop = async () => {
    await worker.close();
    redis.disconnect();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}
