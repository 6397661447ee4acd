"""The site: its round (instruction in, policy checked, train / evaluate / query, reply out;
:mod:`clients.site.site_round`), its policy and privacy ledger, and what it keeps between
rounds (state store, decoded-data cache, last global model, atomic files). No Flower."""
