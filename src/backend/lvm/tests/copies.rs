use super::*;

/// A thin class (overprovision 4) with a formatted 64 MiB filesystem volume `pvc-1`.
pub(super) async fn thin_with_formatted(f: &Fixture) -> LvmBackend {
    let b = f.thin(4.0).await;
    let token = Token::for_name("pvc-1");
    b.create(&spec("pvc-1", 64 * MIB, VolumeMode::Filesystem))
        .await
        .unwrap();
    b.begin_format(&token).await.unwrap();
    b.mark_formatted(&token).await.unwrap();
    b
}

impl Fixture {
    /// What a daemon killed inside a thin copy's create left in `pool0`: an LV named
    /// after `spec`, of `size` bytes, with its volume tags, the pending tag and `extra`.
    pub(super) fn plant_pending_copy(&self, spec: &CreateSpec, size: u64, extra: &[&str]) {
        let mut tags = tags::volume_tags(&ClassName::parse("thin").unwrap(), spec);
        tags.push(tags::PENDING.to_string());
        tags.extend(extra.iter().map(|t| t.to_string()));
        self.vg.lock().unwrap().lvs.push(FakeLv {
            name: spec.name.clone(),
            size,
            tags,
            pool: Some("pool0".into()),
            thin_pool: false,
            zeroing: false,
            in_use: false,
        });
        self.group.invalidate();
    }
}
