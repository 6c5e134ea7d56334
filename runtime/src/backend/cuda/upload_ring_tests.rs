//! GPU checks of the staged uploads ([`super::upload_ring`]): values arrive whole through every
//! slot and slot size, and an upload does not wait for the device work enqueued before it.

use crate::backend::{Backend, DType};

use super::tests::device;

#[test]
fn staged_uploads_arrive_whole_through_every_slot_and_size() {
    let Some(b) = device() else {
        return;
    };
    // More uploads than slots, sizes across slot growth (4 KiB .. 1 MiB), one past the staged
    // limit (copied from pageable memory) and odd lengths;
    // each source is overwritten right after its upload returns, so a copy that read it
    // late would bring the wrong values.
    let sizes = [
        1usize, 3, 1000, 1024, 5000, 70_000, 262_144, 300_000, 7, 2, 100_000,
    ];
    let mut uploaded = Vec::new();
    for round in 0..4u32 {
        for (i, &n) in sizes.iter().enumerate() {
            let mut src: Vec<u32> = (0..n as u32)
                .map(|v| v ^ (round << 20) ^ i as u32)
                .collect();
            let expect = src.clone();
            let buf = b.upload_u32(&src).unwrap(); // [n] u32
            src.iter_mut().for_each(|v| *v = u32::MAX);
            uploaded.push((buf, expect));
        }
    }
    for (buf, expect) in &uploaded {
        let mut got = vec![0u32; expect.len()]; // [n]
        b.download_u32(buf, &mut got).unwrap();
        assert_eq!(&got, expect);
    }
    let empty = b.upload_u32(&[]).unwrap();
    assert_eq!(empty.len, 0);
    assert_eq!(empty.dtype, DType::U32);
}

#[test]
fn a_staged_upload_does_not_wait_for_the_work_before_it() {
    let Some(b) = device() else {
        return;
    };
    // Milliseconds of device work (memsets of 256 MiB), an event after it, then a small
    // upload: when the upload returns, that work must still be running.
    let mut big = b.alloc(DType::U32, 64 << 20).unwrap(); // [64 Mi] u32
    for _ in 0..40 {
        b.stream.memset_zeros(&mut big.mem).unwrap();
    }
    let after = b.ctx.new_event(None).unwrap();
    after.record(&b.stream).unwrap();
    let buf = b.upload_u32(&[7, 8, 9]).unwrap(); // [3] u32
    let pending = !after.is_complete();
    let mut got = [0u32; 3];
    b.download_u32(&buf, &mut got).unwrap();
    assert_eq!(got, [7, 8, 9]);
    assert!(
        pending,
        "the upload waited for the device work enqueued before it"
    );
}
