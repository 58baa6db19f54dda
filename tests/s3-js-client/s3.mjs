// Drives Sluice's S3 API with the current AWS SDK for JavaScript v3 and its defaults (request
// checksums on every upload, aws-chunked bodies with trailers for streams, response checksum
// validation). Usage: node s3.mjs <endpoint> <access key> <secret key> <bucket>
// Prints one JSON object: what each step saw. Any SDK error fails the run (exit 1).
import { Readable } from "node:stream";
import { createHash, randomBytes } from "node:crypto";
import { crc32 } from "node:zlib";
import {
  S3Client, CreateBucketCommand, PutObjectCommand, GetObjectCommand, HeadObjectCommand,
  ListObjectsV2Command, DeleteObjectsCommand, DeleteObjectCommand, CreateMultipartUploadCommand,
  UploadPartCommand, CompleteMultipartUploadCommand,
} from "@aws-sdk/client-s3";
import { Upload } from "@aws-sdk/lib-storage";

const [endpoint, accessKeyId, secretAccessKey, bucket] = process.argv.slice(2);
const s3 = new S3Client({
  endpoint, region: "us-east-1", forcePathStyle: true, maxAttempts: 1,
  credentials: { accessKeyId, secretAccessKey },
});
// Every request on stderr, so that a failure names the one that failed.
s3.middlewareStack.add((next) => async (args) => {
  const r = args.request;
  console.error(`${r.method} ${r.path} ${JSON.stringify(r.query ?? {})}`);
  return next(args);
}, { step: "finalizeRequest", name: "logRequests" });
const md5 = (b) => createHash("md5").update(b).digest("hex");
const out = {};

async function body(res) {
  return Buffer.from(await res.Body.transformToByteArray());
}

await s3.send(new CreateBucketCommand({ Bucket: bucket }));

// A Buffer body: the SDK sends the CRC32 of it as a header.
const small = Buffer.from("hello from the JavaScript SDK\n");
const put = await s3.send(new PutObjectCommand({ Bucket: bucket, Key: "small.txt", Body: small }));
out.put_small = { etag: put.ETag, crc32: put.ChecksumCRC32 ?? null };

// A stream of known length: aws-chunked with the checksum in a trailer.
const streamed = randomBytes(300_000);
const put2 = await s3.send(new PutObjectCommand({
  Bucket: bucket, Key: "dir/streamed.bin", Body: Readable.from([streamed.subarray(0, 100_000),
    streamed.subarray(100_000)]), ContentLength: streamed.length,
  ChecksumAlgorithm: "CRC32C",
}));
out.put_stream = { etag: put2.ETag, crc32c: put2.ChecksumCRC32C ?? null, md5: md5(streamed) };

// Read back with checksum validation on.
const got = await s3.send(new GetObjectCommand({ Bucket: bucket, Key: "dir/streamed.bin",
  ChecksumMode: "ENABLED" }));
out.get_stream = { same: (await body(got)).equals(streamed), crc32c: got.ChecksumCRC32C ?? null };
const head = await s3.send(new HeadObjectCommand({ Bucket: bucket, Key: "small.txt",
  ChecksumMode: "ENABLED" }));
out.head_small = { crc32: head.ChecksumCRC32 ?? null, length: head.ContentLength };

// lib-storage: a multipart upload of 12 MiB in 5 MiB parts, with part checksums.
const big = randomBytes(12 * 1024 * 1024 + 7);
const up = new Upload({ client: s3, params: { Bucket: bucket, Key: "big.bin", Body: big },
  partSize: 5 * 1024 * 1024, queueSize: 2 });
const done = await up.done();
out.multipart = { etag: done.ETag };
const gotBig = await s3.send(new GetObjectCommand({ Bucket: bucket, Key: "big.bin" }));
out.get_big = { same: (await body(gotBig)).equals(big) };

// Multipart uploads with full-object checksums: the parts' CRCs combined by the server. The SDK
// checks the object's CRC on GET (checksum mode), so a wrong combination fails the run.
async function fullObject(key, algo, type, sendWhole) {
  const data = randomBytes(6 * 1024 * 1024 + 3);
  const parts = [data.subarray(0, 5 * 1024 * 1024), data.subarray(5 * 1024 * 1024)];
  const field = `Checksum${algo}`;
  const mp = await s3.send(new CreateMultipartUploadCommand({ Bucket: bucket, Key: key,
    ChecksumAlgorithm: algo, ...(type ? { ChecksumType: type } : {}) }));
  const done = [];
  for (const [i, body] of parts.entries()) {
    const r = await s3.send(new UploadPartCommand({ Bucket: bucket, Key: key,
      UploadId: mp.UploadId, PartNumber: i + 1, Body: body, ChecksumAlgorithm: algo }));
    done.push({ PartNumber: i + 1, ETag: r.ETag, [field]: r[field] });
  }
  const whole = Buffer.alloc(4);
  whole.writeUInt32BE(crc32(data));
  const c = await s3.send(new CompleteMultipartUploadCommand({ Bucket: bucket, Key: key,
    UploadId: mp.UploadId, MultipartUpload: { Parts: done },
    ...(sendWhole ? { [field]: whole.toString("base64"), ChecksumType: "FULL_OBJECT" } : {}) }));
  const g = await s3.send(new GetObjectCommand({ Bucket: bucket, Key: key, ChecksumMode: "ENABLED" }));
  const same = (await body(g)).equals(data);
  await s3.send(new DeleteObjectCommand({ Bucket: bucket, Key: key }));
  return { created: [mp.ChecksumAlgorithm ?? null, mp.ChecksumType ?? null],
    complete: c[field] ?? null, type: c.ChecksumType ?? null, get: g[field] ?? null,
    get_type: g.ChecksumType ?? null, same, crc32: whole.toString("base64") };
}
out.full_crc64nvme = await fullObject("full64.bin", "CRC64NVME", null, false);
out.full_crc32 = await fullObject("full32.bin", "CRC32", "FULL_OBJECT", true);

const list = await s3.send(new ListObjectsV2Command({ Bucket: bucket }));
out.list = (list.Contents ?? []).map((c) => c.Key);

// DeleteObjects: the SDK sends a checksum of the XML body, no Content-MD5.
const del = await s3.send(new DeleteObjectsCommand({ Bucket: bucket, Delete: {
  Objects: [{ Key: "small.txt" }, { Key: "dir/streamed.bin" }] } }));
out.deleted = (del.Deleted ?? []).map((d) => d.Key).sort();
await s3.send(new DeleteObjectCommand({ Bucket: bucket, Key: "big.bin" }));

console.log(JSON.stringify(out));
