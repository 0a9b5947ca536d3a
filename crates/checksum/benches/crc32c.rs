//! CRC32C throughput at the sizes digests see: a PDU header (8..72 bytes),
//! longer pieces to 256 bytes (an FPDU with a command is 84), 512 B, 4 KiB
//! and 128 KiB data; the CRC of zeros, which reads none; and 4 KiB
//! appended to a send buffer with their CRC, copied then fed against fed
//! by the copy's own loads (`Appender`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;

fn crc32c(c: &mut Criterion) {
    let buf: Vec<u8> = (0..(128 << 10) + 8).map(|i: u32| (i.wrapping_mul(31) ^ (i >> 7)) as u8).collect();
    let mut g = c.benchmark_group("crc32c");
    for len in [8usize, 24, 72, 96, 160, 256, 512, 4096, 128 << 10] {
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
    // A device's 4 KiB block appended to a send buffer that a digest
    // covers: the source is one of 256 blocks (1 MiB, past L1 and most of
    // L2), as a RAM device's reads are.
    let src: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    let mut g = c.benchmark_group("append_4096_with_crc");
    g.throughput(Throughput::Bytes(4096));
    let mut out = Vec::with_capacity(8192);
    let mut block = 0usize;
    let mut next = move || {
        block = (block + 97) % 256;
        block * 4096
    };
    g.bench_function("copy_then_crc", |b| {
        b.iter(|| {
            let at = next();
            out.clear();
            out.extend_from_slice(black_box(&src[at..at + 4096]));
            black_box(checksum::crc32c(&out))
        })
    });
    let mut out = Vec::with_capacity(8192);
    g.bench_function("appender", |b| {
        b.iter(|| {
            let at = next();
            out.clear();
            let mut crc = checksum::Crc32c::new();
            checksum::Appender::new(&mut out, Some(&mut crc)).extend_from_slice(black_box(&src[at..at + 4096]));
            black_box(crc.value())
        })
    });
    g.finish();
}

criterion_group!(benches, crc32c);
criterion_main!(benches);
