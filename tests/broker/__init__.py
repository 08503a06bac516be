"""Tests of the remoting server and client shells and of the name server."""
