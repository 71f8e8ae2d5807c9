//! What podman knows about a container but does not put into the OCI spec: its name and
//! image. Podman (4.3 and later) marks its specs (`io.container.manager=libpod`) and
//! nothing more, but before it runs the precreate hook it has made the container's
//! layer in containers/storage, whose `<driver>-containers/containers.json` lists each
//! container with its names, its layer and the image name podman gave it. The spec's
//! root is that layer's `merged` dir (`<graphroot>/overlay/<layer>/merged`, or
//! `<graphroot>/vfs/dir/<layer>` with the vfs driver), so the layer ties the spec to
//! exactly one entry. The file is podman's, written atomically under its lock; podman's
//! API is never called (it holds the container's lock during create).
//!
//! The name only labels the holder (status, refusals, the audit log); nothing is
//! decided by it, and it is cleaned like every engine's text (`engine::clean`).

use super::engine;
use crate::base::safe_open::{self, Links};
use crate::model::holder::ContainerInfo;
use serde::Deserialize;
use std::path::{Component, Path, PathBuf};

/// containers/storage's list of containers, under the graph root: `<driver>` + this.
const CONTAINERS_FILE: &str = "-containers/containers.json";

/// One entry of containers.json: what gpupin reads of it.
#[derive(Deserialize)]
struct StoredContainer {
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    layer: String,
    /// A JSON object in a string, written by podman: `{"image-name": ..., "name": ...}`.
    #[serde(default)]
    metadata: String,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(rename = "image-name", default)]
    image_name: Option<String>,
}

/// The storage's list of containers and the layer id a podman container's root path
/// names, for the overlay and vfs storage drivers; `None` for any other path.
fn containers_file_and_layer(root: &Path) -> Option<(PathBuf, String)> {
    let parts: Vec<&str> = root
        .components()
        .map(|c| match c {
            Component::Normal(p) => p.to_str(),
            Component::RootDir => Some(""),
            _ => None,
        })
        .collect::<Option<Vec<&str>>>()?;
    let (graph, driver, layer) = match parts.as_slice() {
        [graph @ .., "overlay", layer, "merged"] => (graph, "overlay", layer),
        [graph @ .., "vfs", "dir", layer] => (graph, "vfs", layer),
        _ => return None,
    };
    let hex_id = layer.len() == 64 && layer.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex_id {
        return None;
    }
    let file = PathBuf::from(graph.join("/")).join(format!("{driver}{CONTAINERS_FILE}"));
    Some((file, layer.to_string()))
}

/// Engine, name and image of the podman container whose root is `root` (the spec's
/// `root.path`), from containers/storage; only the engine when the storage cannot tell.
pub(crate) fn container_at(root: &Path) -> ContainerInfo {
    let mut info = engine::engine_only(engine::PODMAN);
    let Some((file, layer)) = containers_file_and_layer(root) else {
        return info;
    };
    let stored: Vec<StoredContainer> = match safe_open::read(&file, Links::Refuse)
        .map_err(|e| e.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
    {
        Ok(stored) => stored,
        Err(err) => {
            tracing::debug!(file = %file.display(), error = %err, "podman's container list unread: no name");
            return info;
        }
    };
    let Some(found) = stored.iter().find(|c| c.layer == layer) else {
        return info;
    };
    info.name = found.names.first().and_then(|n| engine::clean(n));
    info.image = serde_json::from_str::<Metadata>(&found.metadata)
        .ok()
        .and_then(|m| m.image_name)
        .and_then(|i| engine::clean(&i));
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYER: &str = "9df3338e5b286bca539114a140237c7d4df3063920821480c45f2a2a3b5c4f9e";

    /// A graph root with containers.json as podman 4.3 wrote it for `podman run --name
    /// mybox2 localhost/hx:1` (seen at precreate), plus another container.
    fn storage() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("overlay-containers");
        std::fs::create_dir_all(&dir).unwrap();
        let vfs = tmp.path().join("vfs-containers");
        std::fs::create_dir_all(&vfs).unwrap();
        let list = serde_json::json!([
            {"id": "1111", "names": ["other"], "layer": "a".repeat(64), "metadata": "{}"},
            {"id": "2222", "names": ["not-a-layer-id"], "layer": "g".repeat(64), "metadata": "{}"},
            {"id": "3333", "names": ["short"], "layer": &LAYER[..63], "metadata": "{}"},
            {"id": "0c473589d6e16b07b5cae8592eddf305945e87bf17adcf741bacf866cf1fb45d",
             "names": ["mybox2"], "image": "d78356d3", "layer": LAYER,
             "metadata": "{\"image-name\":\"localhost/hx:1\",\"image-id\":\"d78356d3\",\"name\":\"mybox2\",\"created-at\":1796432795}",
             "created": "2026-12-05T01:06:35.373926441Z", "flags": {"Volatile": true}}
        ]);
        std::fs::write(dir.join("containers.json"), list.to_string()).unwrap();
        std::fs::write(vfs.join("containers.json"), list.to_string()).unwrap();
        tmp
    }

    #[test]
    fn the_layer_in_the_root_path_names_the_container() {
        let tmp = storage();
        let root = tmp.path().join("overlay").join(LAYER).join("merged");
        let info = container_at(&root);
        assert_eq!(info.engine.as_deref(), Some("podman"));
        assert_eq!(info.name.as_deref(), Some("mybox2"));
        assert_eq!(info.image.as_deref(), Some("localhost/hx:1"));
        let vfs = container_at(&tmp.path().join("vfs/dir").join(LAYER));
        assert_eq!(vfs.name.as_deref(), Some("mybox2"));
    }

    #[test]
    fn any_other_root_or_an_unknown_layer_tells_only_the_engine() {
        let tmp = storage();
        let only = engine::engine_only(engine::PODMAN);
        for root in [
            tmp.path()
                .join("overlay")
                .join("b".repeat(64))
                .join("merged"),
            tmp.path().join("overlay").join(LAYER).join("diff"),
            tmp.path()
                .join("overlay/../overlay")
                .join(LAYER)
                .join("merged"),
            PathBuf::from("/bundle/rootfs"),
            PathBuf::from("rootfs"),
            // Only a layer id (64 hex digits) under a graph root names an entry.
            tmp.path()
                .join("overlay")
                .join("g".repeat(64))
                .join("merged"),
            tmp.path().join("overlay").join(&LAYER[..63]).join("merged"),
        ] {
            assert_eq!(container_at(&root), only, "{}", root.display());
        }
    }

    #[test]
    fn a_link_in_place_of_the_list_or_a_broken_list_gives_no_name() {
        let tmp = storage();
        let file = tmp.path().join("overlay-containers/containers.json");
        let real = tmp.path().join("real.json");
        std::fs::rename(&file, &real).unwrap();
        std::os::unix::fs::symlink(&real, &file).unwrap();
        let root = tmp.path().join("overlay").join(LAYER).join("merged");
        assert_eq!(container_at(&root).name, None);
        std::fs::remove_file(&file).unwrap();
        std::fs::write(&file, "[{\"names\": [\"x\"], \"layer\": 7}]").unwrap();
        assert_eq!(container_at(&root).name, None);
    }

    #[test]
    fn a_name_with_control_characters_is_cleaned() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("overlay-containers");
        std::fs::create_dir_all(&dir).unwrap();
        let list = serde_json::json!([{"names": ["a\nb"], "layer": LAYER, "metadata": "not json"}]);
        std::fs::write(dir.join("containers.json"), list.to_string()).unwrap();
        let info = container_at(&tmp.path().join("overlay").join(LAYER).join("merged"));
        assert_eq!(info.name.as_deref(), Some("a\u{fffd}b"));
        assert_eq!(info.image, None);
    }
}
