//! CRC32C throughput at the sizes digests see: a PDU header (8..72 bytes),
//! 512 B, 4 KiB and 128 KiB data; and the CRC of zeros, which reads none.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;

fn crc32c(c: &mut Criterion) {
    let buf: Vec<u8> = (0..(128 << 10) + 8).map(|i: u32| (i.wrapping_mul(31) ^ (i >> 7)) as u8).collect();
    let mut g = c.benchmark_group("crc32c");
    for len in [8usize, 24, 72, 512, 4096, 128 << 10] {
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, &len| {
            // Offset by one byte: digests cover unaligned PDU payloads.
            b.iter(|| checksum::crc32c(black_box(&buf[1..1 + len])))
        });
    }
    g.finish();
    // Zeros shift the register instead of being read: per call, not per byte.
    let mut g = c.benchmark_group("crc32c_of_zeros");
    for len in [4096usize, 61_440, 128 << 10] {
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, &len| {
            b.iter(|| checksum::crc32c_of_zeros(black_box(len)))
        });
    }
    g.finish();
}

criterion_group!(benches, crc32c);
criterion_main!(benches);
