"""The site policy's [pacs] section: keys checked eagerly, naming the file and key; the three checks."""

from __future__ import annotations

import pytest

from clients.site.policy import PolicyRefusal, SitePolicy, SitePolicyError, load_policy


def policy_file(tmp_path, text):
    path = tmp_path / "policy.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_pacs_section_is_read_and_a_file_without_it_contacts_no_pacs(tmp_path):
    rules = load_policy(policy_file(tmp_path, '[pacs]\nendpoints = ["https://pacs/dicom-web/", '
                                              '"PACS01@10.0.0.5:104"]\nmax-cohort = 50\n')).pacs
    assert rules.endpoints == ("PACS01@10.0.0.5:104", "https://pacs/dicom-web")
    assert (rules.max_cohort, rules.write_back) == (50, False)
    rules.check_endpoint("https://pacs/dicom-web")
    with pytest.raises(PolicyRefusal, match="pacs.endpoints"):
        rules.check_endpoint("PACS01@10.0.0.6:104")
    rules.check_cohort(50)
    with pytest.raises(PolicyRefusal, match="51 studies, more than the policy's max-cohort 50"):
        rules.check_cohort(51)
    with pytest.raises(PolicyRefusal, match="pacs.write-back"):
        rules.check_write_back()
    load_policy(policy_file(tmp_path, "[pacs]\nwrite-back = true\n")).pacs.check_write_back()
    bare = load_policy(policy_file(tmp_path, "min-batch-size = 4\n")).pacs
    with pytest.raises(PolicyRefusal, match="pacs.endpoints"):
        bare.check_endpoint("https://pacs/dicom-web")
    SitePolicy.permissive().pacs.check_endpoint("https://anything/dicom-web")


@pytest.mark.parametrize("text, key", [
    ('endpoints = ["ftp://pacs"]', "pacs.endpoints"),
    ('endpoints = "https://pacs"', "pacs.endpoints"),
    ("max-cohort = -1", "pacs.max-cohort"),
    ("max-cohort = 2.5", "pacs.max-cohort"),
    ('write-back = "yes"', "pacs.write-back"),
    ("writeback = true", "pacs.writeback"),
])
def test_a_bad_pacs_key_names_the_file_and_the_key(tmp_path, text, key):
    path = policy_file(tmp_path, f"[pacs]\n{text}\n")
    with pytest.raises(SitePolicyError, match=rf"site policy {path}: .*'{key}'"):
        load_policy(path)
